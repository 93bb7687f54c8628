"""Health probes for real: the HTTP server every service runs and the command that
probes it, systemd's notifications, and the scheduler's checks against the real servers (a
standby says it is not leading; a broker cut off makes it degraded, and the probe answers
meanwhile; a database away makes it unavailable)."""

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from redis.asyncio import Redis

from bench.cluster import free_port
from services.scheduler import health as scheduler_health
from services.scheduler.leader import Leadership
from shared.messaging import redis_client
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology
from shared.runtime import health as runtime_health
from shared.runtime.health import Check, Health
from shared.store.db import SCHEDULER_LOCK_KEY, open_pool
from tests.conftest import REDIS_URL
from tests.e2e.links import Link

pytestmark = pytest.mark.integration


class _Counted(Health):
    """A `Health` that tells when it has been asked."""

    def __init__(self, service: str) -> None:
        super().__init__(service)
        self.asked = asyncio.Event()

    async def answer(self) -> dict[str, Any]:
        self.asked.set()
        return await super().answer()


async def _fine() -> dict[str, Check]:
    return {"database": Check(True, "answers"), "leading": Check(False, "standing by", "none")}


@pytest.fixture
async def served() -> AsyncIterator[tuple[_Counted, str]]:
    health = _Counted("scheduler")
    port = free_port()
    async with health.serve("127.0.0.1", port):
        yield health, f"http://127.0.0.1:{port}"


async def _raw(base: str, request: bytes) -> bytes:
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_the_server_answers_503_while_starting_then_200_with_the_checks(
    served: tuple[_Counted, str],
) -> None:
    health, base = served
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        health.starting("connecting to RabbitMQ")
        starting = await client.get("/healthz")
        health.up(_fine)
        up = await client.get("/healthz")
        head = await client.head("/healthz")

    assert starting.status_code == 503
    assert starting.json()["checks"]["started"]["detail"] == "starting: connecting to RabbitMQ"
    assert up.status_code == 200
    assert up.headers["content-type"] == "application/json"
    assert up.json()["service"] == "scheduler"
    assert up.json()["status"] == "ok"
    assert up.json()["checks"]["leading"] == {"ok": False, "detail": "standing by"}
    assert (head.status_code, head.content) == (200, b"")


async def test_the_server_refuses_other_paths_methods_and_what_is_not_http(
    served: tuple[_Counted, str],
) -> None:
    _, base = served
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        other = await client.get("/metrics")
        post = await client.post("/healthz")
    garbage = await _raw(base, b"hello\r\n\r\n")
    bare_lf = await _raw(base, b"GET /healthz HTTP/1.0\n\n")

    assert other.status_code == 404
    assert post.status_code == 405
    assert garbage.startswith(b"HTTP/1.0 400 ")
    assert bare_lf.startswith(b"HTTP/1.0 503 ")  # not started: still an answer


async def test_the_command_exits_0_on_200_and_1_on_503_or_no_answer(
    served: tuple[_Counted, str], capsys: pytest.CaptureFixture[str]
) -> None:
    health, base = served

    starting = await asyncio.to_thread(runtime_health.main, [f"{base}/healthz"])
    said_starting = capsys.readouterr().out
    health.up(_fine)
    up = await asyncio.to_thread(runtime_health.main, [f"{base}/healthz"])
    said_up = capsys.readouterr().out
    nobody = f"http://127.0.0.1:{free_port()}/healthz"
    absent = await asyncio.to_thread(runtime_health.main, [nobody, "--timeout", "1"])

    assert (starting, said_starting) == (1, "unavailable: starting: not up yet\n")
    assert (up, said_up) == (0, "ok: standing by\n")
    assert absent == 1
    assert capsys.readouterr().out.startswith(f"no answer from {nobody}")


async def test_the_command_waits_until_the_service_is_up(served: tuple[_Counted, str]) -> None:
    health, base = served
    waiting = asyncio.create_task(
        asyncio.to_thread(runtime_health.main, [f"{base}/healthz", "--wait", "30"])
    )

    async with asyncio.timeout(10):
        await health.asked.wait()  # it was told 503 once
    assert not waiting.done()
    health.up(_fine)

    async with asyncio.timeout(10):
        assert await waiting == 0


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket standing for systemd's, named by `NOTIFY_SOCKET`, with a watchdog."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        monkeypatch.setenv("WATCHDOG_USEC", "100000")
        monkeypatch.setattr(runtime_health, "STATUS_EVERY_S", 0.05)
        yield sock


async def test_under_systemd_a_service_says_ready_its_status_and_pings_the_watchdog(
    notify_socket: socket.socket,
) -> None:
    loop = asyncio.get_running_loop()
    health = Health("scheduler")
    said: list[str] = []

    async def until(prefix: str) -> None:
        while not any(line.startswith(prefix) for line in said):
            said.append((await loop.sock_recv(notify_socket, 4096)).decode())

    async with asyncio.timeout(10), health.serve("127.0.0.1", 0):
        await until("WATCHDOG=1")
        health.starting("connecting to RabbitMQ")
        health.up(_fine)
        await until("STATUS=ok")

    assert "STATUS=starting: connecting to RabbitMQ" in said
    assert said.index("READY=1") < said.index("STATUS=ok: standing by")
    assert said.count("WATCHDOG=1") >= 1
    assert "NOTIFY_SOCKET" not in os.environ  # the commands a worker starts never see it


async def test_redis_that_does_not_answer_is_a_degraded_check() -> None:
    closed = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    try:
        check = await redis_client.health(closed)
    finally:
        await closed.aclose()

    assert check == Check(False, "reconnecting to Redis")


async def _answer(client: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    response = await client.get("/healthz")
    body: dict[str, Any] = response.json()
    return response.status_code, body


async def _until(client: httpx.AsyncClient, status: str, check: str, ok: bool) -> dict[str, Any]:
    """The first answer with this status and this check holding (or not); 15 s at most."""
    async with asyncio.timeout(15):
        while True:
            _, body = await _answer(client)
            if body["status"] == status and body["checks"][check]["ok"] is ok:
                return body
            await asyncio.sleep(0.05)


async def test_a_standby_scheduler_is_healthy_says_it_does_not_lead_and_rides_out_a_broker_cut(
    fresh_url: str, broker_link: Link, namespace: str
) -> None:
    other = await asyncpg.connect(fresh_url)  # the leader, elsewhere
    await other.execute("SELECT pg_advisory_lock($1)", SCHEDULER_LOCK_KEY)
    health, port = Health("scheduler"), free_port()
    leadership = Leadership(fresh_url)
    topology = Topology(namespace)
    try:
        async with (
            open_pool(fresh_url, max_size=2) as pool,
            open_broker(broker_link.urls["amqp"], topology, "test-probes") as broker,
            redis_client.open_redis(REDIS_URL) as redis,
            health.serve("127.0.0.1", port),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
        ):
            health.up(scheduler_health.probe(pool, broker, redis, leadership))
            code, standby = await _answer(client)
            assert (code, standby["status"]) == (200, "ok"), standby
            assert standby["checks"]["leading"] == {
                "ok": False,
                "detail": "standing by: another scheduler leads",
            }

            broker_link.cut()
            cut = await _until(client, "degraded", "broker", ok=False)
            assert cut["checks"]["broker"]["detail"].startswith("reconnecting to RabbitMQ (")
            broker_link.heal()
            await _until(client, "ok", "broker", ok=True)

            await other.close()  # the leader goes: this one takes over
            stop = asyncio.Event()
            async with asyncio.timeout(15):
                assert await leadership.acquire(stop)
            _, leader = await _answer(client)
            assert leader["checks"]["leading"] == {"ok": True, "detail": "leading"}

            await pool.close()  # the database away, as far as this scheduler can tell
            code, away = await _answer(client)
            assert (code, away["status"]) == (503, "unavailable")
            assert away["checks"]["database"] == {
                "ok": False,
                "detail": "reconnecting to PostgreSQL",
            }
            await broker.events.delete()
            await broker.work.delete()
    finally:
        await leadership.release()
        if not other.is_closed():
            await other.close()
