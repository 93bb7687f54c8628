"""No task left undriven: a task PostgreSQL says a worker instance holds
but that none of its handlings drives (the reply of its take was lost after the take
committed) is driven again by that worker's reconcile from where it rests, when nothing after
its take had started, and failed as lost otherwise; never run twice.

The worker's consumer and stage runner run in the test's process against the real PostgreSQL,
RabbitMQ and Redis, with real commands. The lost reply is real too: the runner's connections go
through a relay that lets a COMMIT reach the server and then drops the connection instead of
passing its reply on (`CommitEater`)."""

import asyncio
import contextlib
import logging
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from redis.asyncio import Redis

from services.worker.admission import Admission
from services.worker.consumer import Consumer
from services.worker.stages import StageRunner
from shared.domain.messages import RunStage
from shared.domain.states import FailureClass, Stage, TaskState
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology, host_key, pool_key
from shared.store import db, jobs_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.task_types.registry import load_task_types
from tests.conftest import AMQP_URL, REDIS_URL
from tests.integration.test_stage_runner import _settings as worker_settings

pytestmark = pytest.mark.integration
S = TaskState

#: How long a task driven again may take to end (its command is `true`, or one line).
ENDS_WITHIN_S = 30.0


class CommitEater:
    """A TCP relay to PostgreSQL that, once armed, lets the next COMMIT through to the server
    and drops that connection when the server answers it, before the answer reaches the
    client: the transaction committed, and its client only knows that its connection went."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.armed = False
        self.eaten = 0  # COMMITs whose reply was dropped

    async def relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        committing = asyncio.Event()  # a COMMIT of this connection went to the server

        async def to_server() -> None:
            # the startup message has no type byte; every message after it has one
            length = struct.unpack("!I", await client_r.readexactly(4))[0]
            server_w.write(struct.pack("!I", length) + await client_r.readexactly(length - 4))
            while True:
                kind = await client_r.readexactly(1)
                length = struct.unpack("!I", await client_r.readexactly(4))[0]
                body = await client_r.readexactly(length - 4)
                if self.armed and kind == b"Q" and body.upper().startswith(b"COMMIT"):
                    self.armed = False
                    committing.set()
                server_w.write(kind + struct.pack("!I", length) + body)
                await server_w.drain()

        async def to_client() -> None:
            while True:
                kind = await server_r.readexactly(1)
                length = struct.unpack("!I", await server_r.readexactly(4))[0]
                body = await server_r.readexactly(length - 4)
                if committing.is_set() and kind == b"C" and body.startswith(b"COMMIT"):
                    self.eaten += 1  # committed on the server; its client never hears it
                    client_w.transport.abort()
                    server_w.close()
                    return
                client_w.write(kind + struct.pack("!I", length) + body)
                await client_w.drain()

        pumps = [asyncio.create_task(to_server()), asyncio.create_task(to_client())]
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        client_w.transport.abort()
        server_w.close()


@pytest.fixture
async def eater(session_database_url: str) -> AsyncIterator[tuple[CommitEater, str]]:
    parts = urlsplit(session_database_url)
    relay = CommitEater((parts.hostname or "127.0.0.1", parts.port or 5432))
    server = await asyncio.start_server(relay.relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
    async with server:
        yield relay, urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable"))


@dataclass
class Worker:
    """One worker instance: its stage runner and consumer, in this process."""

    runner: StageRunner
    consumer: Consumer
    broker: Broker

    @property
    def host_id(self) -> str:
        return self.runner.settings.host_id


@contextlib.asynccontextmanager
async def _worker(
    database_url: str, namespace: str, work_root: Path, *, consuming: bool
) -> AsyncIterator[Worker]:
    """A worker of a host of its own, unconfined, without cgroups, its connections to
    PostgreSQL through `database_url`; consuming its queues (and reconciling every 0.1 s) if
    `consuming`, else its reconcile is called by the test."""
    settings = worker_settings(database_url, namespace, work_root, worker_slots=2, reconcile_s=0.1)
    redis = Redis.from_url(REDIS_URL)
    async with (
        db.open_pool(database_url, max_size=4, generic_plans=True) as pool,
        open_broker(AMQP_URL, Topology(namespace), name="test-undriven") as broker,
    ):
        runner = StageRunner(
            settings,
            pool,
            broker,
            redis,
            RedisKeys(namespace),
            load_task_types(),
            f"{settings.host_id}-{uuid.uuid4().hex[:6]}",
        )
        consumer = Consumer(runner, settings.worker_slots)
        if consuming:
            await consumer.start(broker, settings.host_id, "default", Admission.OPEN)
        try:
            yield Worker(runner, consumer, broker)
        finally:
            await consumer.stop_intake()
            assert await consumer.drain(ENDS_WITHIN_S) == 0
            await runner.background_done()
    await redis.aclose()


async def _task(
    pool: db.Pool, on: Worker, command: str, state: TaskState, **columns: Any
) -> tasks_repo.Task:
    """Given-step: a job of one task resting in `state` on the worker's host, claimed (as the
    dispatcher claims one), with `columns` set as well."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("u", "shell", command, ["a"]))
        [task] = await tasks_repo.list_for_job(conn, job.id)
        workdir = on.runner.taker.workdir(job.id, task.id)
        sets = {"state": state.value, "claim": uuid.uuid4(), "host": on.host_id}
        sets |= {"workdir": str(workdir)} | columns
        await conn.execute(
            "UPDATE tasks SET "
            + ", ".join(f"{name} = ${i}" for i, name in enumerate(sets, start=2))
            + " WHERE id = $1",
            task.id,
            *sets.values(),
        )
        taken = await tasks_repo.get(conn, task.id)
    assert taken is not None
    return taken


async def _until(what: str, check: Callable[[], Any]) -> None:
    """Wait for `check()` (awaited) to hold, up to ENDS_WITHIN_S."""
    try:
        async with asyncio.timeout(ENDS_WITHIN_S):
            while not await check():  # noqa: ASYNC110  (other processes' commits: no event)
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {ENDS_WITHIN_S:g} s: {what}") from None


async def _state(pool: db.Pool, task_id: str) -> TaskState:
    return TaskState(await pool.fetchval("SELECT state FROM tasks WHERE id = $1", task_id))


async def _attempts(pool: db.Pool, task_id: str) -> list[tuple[str, str | None, bool]]:
    rows = await pool.fetch(
        "SELECT stage, outcome, ended_at IS NOT NULL AS ended FROM attempts"
        " WHERE task_id = $1 ORDER BY attempt",
        task_id,
    )
    return [(r["stage"], r["outcome"], r["ended"]) for r in rows]


async def test_a_take_whose_reply_was_lost_after_it_committed_is_driven_by_its_worker(
    pool: db.Pool,
    eater: tuple[CommitEater, str],
    namespace: str,
    tmp_path: Path,
) -> None:
    relay, through = eater
    effects = tmp_path / "effects"
    async with _worker(through, namespace, tmp_path / "work", consuming=True) as worker:
        # given: a task set up and resting `queued` on this host, dispatched to it again (as
        # after its job was resumed): its work message adopts it, in one transaction
        task = await _task(pool, worker, f"echo ran >> {effects}", S.QUEUED, attempt=1)
        assert task.claim is not None
        message = RunStage(
            job_id=task.job_id, task_id=task.id, stage=Stage.CLUSTER, claim=task.claim
        )

        # when: the adoption commits, and its reply is lost with the connection
        relay.armed = True
        await worker.broker.publish_work(host_key(worker.host_id), message)

        async def eaten() -> bool:
            return relay.eaten == 1

        await _until("the adoption's COMMIT answered", eaten)

        # then: the worker, which found the task taken when it took it again, drives it
        async def completed() -> bool:
            return await _state(pool, task.id) is S.COMPLETED

        await _until("the task completed", completed)
        assert [a[0] for a in await _attempts(pool, task.id)] == ["cluster", "post_processing"]
        assert await worker.consumer.reconcile() == 0  # nothing held is left undriven
    assert effects.read_text() == "ran\n"  # once


async def test_a_task_left_setting_up_is_set_up_again_under_its_open_attempt_and_run_once(
    pool: db.Pool, session_database_url: str, namespace: str, tmp_path: Path, caplog: Any
) -> None:
    effects, go = tmp_path / "effects", tmp_path / "go"
    command = f"echo ran >> {effects}; while [ ! -e {go} ]; do sleep 0.05; done"
    caplog.set_level(logging.WARNING, logger="services.worker.consumer")
    async with _worker(session_database_url, namespace, tmp_path / "w", consuming=False) as worker:
        # given: a task its take made `setting_up` (its setup attempt open) for this worker,
        # which never heard back: the durable state a lost reply leaves
        task = await _task(
            pool, worker, command, S.SETTING_UP, attempt=1, worker=worker.runner.instance
        )
        assert task.claim is not None
        await pool.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker, claim)"
            " VALUES ($1, 1, 1, 'setup', $2, $3, $4)",
            task.id,
            worker.host_id,
            worker.runner.instance,
            task.claim,
        )
        await worker.consumer.start(worker.broker, worker.host_id, "default", Admission.OPEN)

        # when: its reconcile finds it held and driven by none: it is set up and its command
        # started...
        async def started() -> bool:
            return effects.exists() and effects.read_text() == "ran\n"

        await _until("the command started", started)

        # ...and its work message, delivered again meanwhile, is acked, never taken
        message = RunStage(job_id=task.job_id, task_id=task.id, stage=Stage.SETUP, claim=task.claim)
        await worker.broker.publish_work(pool_key(), message)

        async def dropped() -> bool:
            return any("came again; already ours" in r.getMessage() for r in caplog.records)

        await _until("the delivery again dropped", dropped)
        go.touch()

        async def completed() -> bool:
            return await _state(pool, task.id) is S.COMPLETED

        await _until("the task completed", completed)

    # then: it ran once, its take's setup attempt carried on and closed (none left open)
    assert effects.read_text() == "ran\n"
    assert await _attempts(pool, task.id) == [
        ("setup", "queued", True),
        ("cluster", "data_ready", True),
        ("post_processing", "completed", True),
    ]


async def test_a_held_command_nobody_follows_is_failed_as_lost_not_run_again(
    pool: db.Pool, session_database_url: str, namespace: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    async with _worker(session_database_url, namespace, tmp_path / "w", consuming=False) as worker:
        # given: a task `on_cpu` for this worker (its command started, pid 4242), that none of
        # its handlings drives any more
        task = await _task(
            pool,
            worker,
            f"echo ran >> {effects}",
            S.ON_CPU,
            attempt=1,
            worker=worker.runner.instance,
            pid=4242,
        )
        await pool.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker, claim, pid)"
            " VALUES ($1, 1, 1, 'cluster', $2, $3, $4, 4242)",
            task.id,
            worker.host_id,
            worker.runner.instance,
            task.claim,
        )

        # when: its reconcile looks
        assert await worker.consumer.reconcile() == 1
        assert await worker.consumer.drain(ENDS_WITHIN_S) == 0

    # then: it is failed as lost, explained, for the triage (its command never runs again
    # here; whatever of it still runs is the supervisor's to kill: its attempt is not reaped)
    async with pool.acquire() as conn:
        lost = await tasks_repo.get(conn, task.id)
    assert lost is not None and lost.state is S.FAILED_ON_CLUSTER
    assert lost.failure_class is FailureClass.LOST and lost.claim is None
    assert lost.error_brief is not None and "drove it no more" in lost.error_brief
    reaped = await pool.fetchval("SELECT reaped_at FROM attempts WHERE task_id = $1", task.id)
    assert reaped is None and not effects.exists()
