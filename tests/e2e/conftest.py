"""End-to-end fixtures: a running stack, an HTTP client, and a listener on the events exchange."""

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from redis.asyncio import Redis

from shared.messaging.topology import Topology, delete_all
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database, new_namespace
from tests.e2e.stack import DEFAULTS_ENV, E2E_ENV, Stack
from tests.installed_cli import VIGIL as VIGIL  # the e2e tests' name for it

pytestmark = pytest.mark.e2e


HOST_ID = "e2e-host"


def vigil(
    env: Mapping[str, str], *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run the installed `vigil args...` to its end, as a user's shell runs it."""
    return subprocess.run(
        [str(VIGIL), *args], env=dict(env), capture_output=True, text=True, timeout=timeout
    )


async def delete_namespace(namespace: str) -> None:
    """A namespace's queues and exchanges (those of `HOST_ID`'s host; the session's sweep
    finds the rest), and its Redis keys: a stack stopped right after a job ended leaves the
    finaliser no time for its second purge (late writers), and a job still running when its
    test ended is never purged."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        await delete_all(await connection.channel(), Topology(namespace), [HOST_ID])
    finally:
        await connection.close()
    redis = Redis.from_url(REDIS_URL)
    try:
        async for key in redis.scan_iter(match=f"{namespace}:*", count=1000):
            await redis.delete(key)
    finally:
        await redis.aclose()


@pytest.fixture(scope="session")
def e2e_namespace() -> Iterator[str]:
    """One broker and Redis namespace for the whole session, deleted at its end.

    Quorum queues are heavy (a Raft group each) and RabbitMQ is not built for their churn, so
    the stacks of one session share their queues; each stack still has a database of its own,
    which makes any message left over from an earlier test a stale no-op.
    """
    namespace = new_namespace("e2e-", 10)
    yield namespace
    asyncio.run(delete_namespace(namespace))


@contextmanager
def running_stack(
    root: Path, namespace: str, extra_env: Mapping[str, str] = E2E_ENV
) -> Iterator[Stack]:
    """The four services, up and healthy, on a fresh database, with `extra_env` (whose
    `VIGIL_WORKER_SLOTS`, if any, the worker takes; without it, it detects its CPUs)."""
    with fresh_database("vigil_e2e") as url:
        s = Stack(
            database_url=url,
            amqp_url=AMQP_URL,
            redis_url=REDIS_URL,
            namespace=namespace,
            root=root,
            hosts=[HOST_ID],
            slots=None,
            extra_env=dict(extra_env),
        )
        with started(s):
            yield s


@contextmanager
def started(s: Stack) -> Iterator[Stack]:
    """`s` up and healthy; stopped on exit, its logs printed (shown when the test failed)."""
    try:
        s.start_all()
        yield s
    finally:
        s.stop_all()
        s.remove_work_root()
        for service in s.names():
            # pytest shows what teardown prints only when the test failed
            print(f"----- {service} -----\n{s.log(service)}")  # noqa: T201


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    """The four services, up and healthy, on a fresh database: at the defaults users get for
    a test marked `defaults`, else with `E2E_ENV`."""
    env = DEFAULTS_ENV if request.node.get_closest_marker("defaults") else E2E_ENV
    with running_stack(tmp_path, e2e_namespace, env) as s:
        yield s


@pytest.fixture
def shared_dir(stack: Stack) -> Path:
    """A dir that the test and its jobs share (markers, gates, effects): the jobs run confined,
    as their owner's uid, and could not reach the test's private tmp dir."""
    return stack.shared_dir(uuid.uuid4().hex[:8])


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as c:
        yield c


@dataclass
class Events:
    """Every message seen on the stack's events exchange, with a way to wait for one."""

    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def add(self, key: str, body: dict[str, Any]) -> None:
        async with self.changed:
            self.received.append((key, body))
            self.changed.notify_all()

    async def wait_for(
        self, predicate: Callable[[str, dict[str, Any]], bool], within: float = 20.0
    ) -> tuple[str, dict[str, Any]]:
        """The first event (seen or to come) matching `predicate`; TimeoutError after `within` s."""
        async with asyncio.timeout(within), self.changed:
            while True:
                for key, body in self.received:
                    if predicate(key, body):
                        return key, body
                await self.changed.wait()

    async def wait_key(self, key: str, within: float = 20.0) -> dict[str, Any]:
        return (await self.wait_for(lambda k, _b: k == key, within))[1]

    def routing_keys(self) -> list[str]:
        return [k for k, _ in self.received]

    def task_states(self, task_id: str | None = None) -> list[str]:
        """The states of `task.<state>.*` events (not the triage's decisions), in order."""
        return [
            b["state"]
            for _k, b in self.received
            if b.get("type") == "task_event" and task_id in (None, b["task_id"])
        ]

    def finals(self, job_id: str) -> int:
        """How many times the job ended (`job.succeeded|failed` with no task)."""
        ends = (f"job.succeeded.{job_id}", f"job.failed.{job_id}")
        return sum(k in ends and b.get("task_id") is None for k, b in self.received)


@pytest.fixture
async def events(stack: Stack) -> AsyncIterator[Events]:
    """Listens to `#` on the stack's events exchange from before the test acts."""
    seen = Events()
    connection = await aio_pika.connect_robust(AMQP_URL)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        Topology(stack.namespace).events_exchange, aio_pika.ExchangeType.TOPIC, durable=True
    )
    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
    await queue.bind(exchange, "#")

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            await seen.add(message.routing_key or "", json.loads(message.body))

    await queue.consume(on_message)
    try:
        yield seen
    finally:
        await connection.close()


async def wait_job(
    client: httpx.AsyncClient, events: Events, job_id: str, within: float = 30.0
) -> dict[str, Any]:
    """Wait for the job's end (`job.succeeded|failed.<job>` with no task: a task's own
    `job.failed`, e.g. for its error log, is not the end) and return the job as the API
    shows it then."""
    await events.wait_for(
        lambda k, b: (
            k in (f"job.succeeded.{job_id}", f"job.failed.{job_id}") and b.get("task_id") is None
        ),
        within,
    )
    response = await client.get(f"/jobs/{job_id}")
    response.raise_for_status()
    return dict(response.json())


@pytest.fixture
def env(stack: Stack, tmp_path: Path) -> dict[str, str]:
    """The environment of a user of the stack: its URL and token, no config file."""
    assert VIGIL.exists(), f"{VIGIL} is missing: pip install -e . installs the command"
    home = tmp_path / "home"
    home.mkdir()
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "XDG_"))}
    return kept | {"HOME": str(home), "VIGIL_URL": stack.base_url, "VIGIL_TOKEN": stack.token}
