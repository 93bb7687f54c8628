"""Self-fencing: a service whose lease has expired (no heartbeat has
reached PostgreSQL for half the fence timeout) kills every command of its host, and only
those; with a fresh lease it kills nothing; and only the database renews the lease."""

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from services.worker.admission import Admission
from services.worker.registration import Presence, heartbeat
from shared.host import marks
from shared.host.capacity import HostCapacity
from shared.host.fence import Lease, fence_after, fence_if_expired
from shared.messaging.redis_keys import RedisKeys
from shared.store import db


def _command(namespace: str, host: str) -> subprocess.Popen[bytes]:
    mark = marks.mark(namespace, host, f"t-{uuid.uuid4().hex[:12]}", uuid.uuid4())
    return subprocess.Popen(["sleep", "60"], env={marks.VARIABLE: mark, "PATH": "/usr/bin:/bin"})


@pytest.fixture
def namespace() -> str:
    return f"fence-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def commands(namespace: str) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    ours, other_hosts = _command(namespace, "h-cut"), _command(namespace, "h-fine")
    yield ours, other_hosts
    for proc in (ours, other_hosts):
        proc.kill()
        proc.wait()


def _marked_seen(namespace: str, host: str, pid: int) -> None:
    """Given-step: /proc shows the command's mark (it is set before exec)."""
    deadline = time.monotonic() + 10
    while pid not in {m.pid for m in marks.marked_processes(namespace, host)}:
        assert time.monotonic() < deadline, "the command's mark never showed in /proc"
        time.sleep(0.01)


def test_an_expired_lease_kills_this_hosts_commands_and_no_others(
    namespace: str, commands: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    ours, other_hosts = commands
    _marked_seen(namespace, "h-cut", ours.pid)
    lease = Lease(renewed_at=time.monotonic() - 31)  # the last beat landed 31 s ago

    killed = fence_if_expired(lease, namespace, "h-cut", None, fence_timeout_s=60)

    assert [k.pid for k in killed] == [ours.pid]
    assert ours.wait(timeout=10) == -9
    assert other_hosts.poll() is None


def test_a_fresh_lease_kills_nothing(
    namespace: str, commands: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    ours, _ = commands
    _marked_seen(namespace, "h-cut", ours.pid)
    lease = Lease(renewed_at=time.monotonic() - 29)

    assert fence_if_expired(lease, namespace, "h-cut", None, fence_timeout_s=60) == []
    assert ours.poll() is None


def test_the_lease_is_dated_by_the_latest_beat_sent_and_fences_at_half_the_timeout() -> None:
    lease = Lease(renewed_at=100.0)
    lease.renew(sent_at=90.0)  # an older beat that landed late does not move it back
    assert lease.renewed_at == 100.0
    lease.renew(sent_at=105.0)
    assert lease.renewed_at == 105.0
    assert fence_after(60) == 30


@pytest.mark.integration
async def test_a_worker_with_redis_away_still_renews_its_lease_through_the_database(
    pool: db.Pool,
) -> None:
    # Redis away is no partition from PostgreSQL: the worker must not fence its commands for it.
    host = f"h-{uuid.uuid4().hex[:8]}"
    await pool.execute("INSERT INTO hosts (id, slots) VALUES ($1, 1)", host)
    redis = Redis.from_url("redis://127.0.0.1:1")  # nothing listens there
    lease = Lease(renewed_at=time.monotonic() - 1000)
    stop = asyncio.Event()

    async def admitted(_admission: Admission) -> None:
        pass

    beating = asyncio.create_task(
        heartbeat(
            pool,
            redis,
            RedisKeys("t"),
            Presence(host, "w-1", HostCapacity.of(1, 0)),
            0.01,
            stop,
            admitted,
            lease,
        )
    )
    try:
        async with asyncio.timeout(10):
            while lease.age() > 100:  # noqa: ASYNC110  (the lease has no event to wait on)
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await beating
        await redis.aclose()
