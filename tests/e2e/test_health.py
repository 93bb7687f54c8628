"""Every service answers a health probe, as processes: the scheduler, the worker and
the supervisor on their own ports (`bench.cluster` gives each a free one), the api on its own.
A standby scheduler is healthy and says it does not lead, until the leader goes; a host cut off
from the broker or from the database says it is degraded, and why, and ok again once back; a
service still waiting for the broker at its start answers 503, saying so."""

import asyncio
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cluster import free_port
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database
from tests.e2e.conftest import HOST_ID, started
from tests.e2e.links import Link, link_loop
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

WAIT_S = 30.0


def _stack(root: Path, namespace: str, url: str, **more: Any) -> Stack:
    return Stack(
        database_url=url,
        amqp_url=more.pop("amqp_url", AMQP_URL),
        redis_url=REDIS_URL,
        namespace=namespace,
        root=root,
        hosts=[HOST_ID],
        extra_env=dict(E2E_ENV),
        **more,
    )


async def _answer(stack: Stack, name: str) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(stack.health_url(name))
    body: dict[str, Any] = response.json()
    return response.status_code, body


async def _until(
    stack: Stack, name: str, holds: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first answer of `name`'s probe for which `holds` (none while the process has not
    opened its port yet); TimeoutError after `WAIT_S`."""
    async with asyncio.timeout(WAIT_S):
        while True:
            try:
                _, body = await _answer(stack, name)
            except httpx.TransportError:
                body = None
            if body is not None and holds(body):
                return body
            await asyncio.sleep(0.1)


def _failing(check: str, status: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: body["status"] == status and not body["checks"][check]["ok"]


def _ok(body: dict[str, Any]) -> bool:
    return bool(body["status"] == "ok")


@pytest.fixture
def two_schedulers(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    with (
        fresh_database("vigil_e2e") as url,
        started(_stack(tmp_path, e2e_namespace, url, schedulers=2)) as s,
    ):
        yield s


async def test_every_service_answers_its_probe_and_a_standby_scheduler_says_it_does_not_lead(
    two_schedulers: Stack,
) -> None:
    s = two_schedulers
    answers = {name: await _answer(s, name) for name in s.names()}
    assert {name: code for name, (code, _) in answers.items()} == dict.fromkeys(s.names(), 200)
    schedulers = {name: body for name, (_, body) in answers.items() if "scheduler" in name}
    assert [b["status"] for b in schedulers.values()] == ["ok", "ok"], schedulers
    leads = sorted(b["checks"]["leading"]["detail"] for b in schedulers.values())
    assert leads == ["leading", "standing by: another scheduler leads"], schedulers
    worker, supervisor = answers["worker"][1], answers["supervisor"][1]
    assert worker["status"] == "ok", worker
    assert set(worker["checks"]) == {"started", "database", "fence", "broker", "redis", "intake"}
    assert worker["checks"]["intake"]["detail"].startswith("taking work from the pool queue")
    assert supervisor["status"] == "ok", supervisor
    watching = await _until(s, "supervisor", lambda b: b["checks"]["worker"]["ok"])
    assert watching["checks"]["worker"]["detail"].startswith("watching worker ")

    # when the leader stops, the standby takes over, and says so
    [leader] = [n for n, b in schedulers.items() if b["checks"]["leading"]["ok"]]
    [standby] = [n for n in schedulers if n != leader]
    await asyncio.to_thread(s.kill, leader, signal.SIGTERM)
    took_over = await _until(s, standby, lambda b: b["checks"]["leading"]["ok"])
    assert took_over["status"] == "ok"


@pytest.fixture
def cut_off_host(tmp_path: Path, e2e_namespace: str) -> Iterator[tuple[Stack, Link, Link]]:
    """A stack whose host reaches PostgreSQL and RabbitMQ through links of its own."""
    with fresh_database("vigil_e2e") as url, link_loop() as loop:
        database = Link(loop, {"VIGIL_DATABASE_URL": url})
        broker = Link(loop, {"VIGIL_AMQP_URL": AMQP_URL})
        host_env = {HOST_ID: {**database.urls, **broker.urls}}
        try:
            with started(_stack(tmp_path, e2e_namespace, url, host_env=host_env)) as s:
                yield s, database, broker
        finally:
            database.close()
            broker.close()


async def test_a_host_cut_off_from_the_broker_or_the_database_says_degraded_and_why(
    cut_off_host: tuple[Stack, Link, Link],
) -> None:
    s, database, broker = cut_off_host
    per_host = ("worker", "supervisor")
    for name in per_host:
        await _until(s, name, _ok)

    broker.cut()
    for name in per_host:  # the probe answers while the broker is away
        body = await _until(s, name, _failing("broker", "degraded"))
        assert body["checks"]["broker"]["detail"].startswith("reconnecting to RabbitMQ ("), body
    broker.heal()
    for name in per_host:
        await _until(s, name, _ok)

    database.cut()
    for name in per_host:
        body = await _until(s, name, _failing("database", "degraded"))
        detail = body["checks"]["database"]["detail"]
        assert detail.startswith("no heartbeat has reached PostgreSQL for "), body
        assert body["checks"]["fence"]["ok"], body  # fencing comes at 30 s
    database.heal()
    for name in per_host:
        await _until(s, name, _ok)


@pytest.fixture
def no_broker(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    """A scheduler, a worker and a supervisor whose broker never answers (a closed port)."""
    with fresh_database("vigil_e2e") as url:
        s = _stack(
            tmp_path, e2e_namespace, url, amqp_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/"
        )
        s.work_root.mkdir(parents=True, exist_ok=True)
        try:
            for name in ("scheduler", "worker", "supervisor"):
                s.start(name)
            yield s
        finally:
            for name in s.procs:  # a start waiting for a server does not stop on SIGTERM
                s.kill(name)
            s.stop_all()


WAITING = "starting: connecting to RabbitMQ"


async def test_a_service_waiting_for_the_broker_at_its_start_answers_503_saying_so(
    no_broker: Stack,
) -> None:
    for name in ("scheduler", "worker", "supervisor"):
        await _until(no_broker, name, lambda b: b["checks"]["started"]["detail"] == WAITING)
        code, body = await _answer(no_broker, name)

        assert code == 503, body
        assert body == {
            "service": name,
            "status": "unavailable",
            "checks": {"started": {"ok": False, "detail": WAITING}},
        }
