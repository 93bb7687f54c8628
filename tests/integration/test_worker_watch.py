"""The supervisor's watch of its host's worker (`services/supervisor/worker_watch.py`): it
follows the worker's registration in Redis and holds a pidfd on the registered process. Real
processes stand for the workers (`sleep`), real Redis and PostgreSQL."""

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import psutil
import pytest
from redis.asyncio import Redis

from services.supervisor.heartbeat import LastBeat
from services.supervisor.worker_watch import WorkerWatch
from shared.messaging.presence import WorkerIdentity, announce
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.store import db
from shared.store.hosts_repo import SupervisorBeat
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes that stand for two successive workers of one host."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _identity(proc: subprocess.Popen[bytes], instance: str) -> WorkerIdentity:
    return WorkerIdentity(instance, proc.pid, psutil.Process(proc.pid).create_time(), 1)


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A client as the services open it (replies decoded)."""
    async with open_redis(REDIS_URL) as client:
        yield client


async def _watching_first(
    pool: db.Pool, redis: Redis, sleepers: list[subprocess.Popen[bytes]]
) -> tuple[WorkerWatch, LastBeat, WorkerIdentity, WorkerIdentity]:
    """Given-step: a watch that follows the first sleeper as its host's worker, and the second
    registered since (not looked at yet); the watch, its last beat and both identities."""
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    keys = RedisKeys(f"ns-{uuid.uuid4().hex[:10]}")
    first, second = _identity(sleepers[0], "w-first"), _identity(sleepers[1], "w-second")
    last = LastBeat()
    watch = WorkerWatch(pool, redis, keys, host_id, None, 10.0, last)
    await announce(redis, keys, host_id, first)
    await watch._step()
    assert watch.current == first
    await announce(redis, keys, host_id, second)
    return watch, last, first, second


async def test_the_watch_keeps_its_live_worker_and_takes_the_next_registration_at_its_exit(
    pool: db.Pool, redis: Redis, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    # given the watch follows the first worker
    watch, _, first, second = await _watching_first(pool, redis, sleepers)
    watched_first = watch.current
    # when another registers while the first lives, the watch keeps the first
    await watch._step()
    still_first = watch.current
    # and once the first exits, the next look reaps it and follows the second
    sleepers[0].kill()
    sleepers[0].wait()
    assert watch._exit is not None
    await asyncio.wait_for(asyncio.shield(watch._exit), 5.0)
    await watch._step()

    assert watched_first == first
    assert still_first == first
    assert watch.current == second


async def test_the_watch_follows_a_worker_the_hosts_row_names_while_the_old_one_lives(
    pool: db.Pool, redis: Redis, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    # given the watch follows the first worker, and another registers beside it
    watch, last, _, second = await _watching_first(pool, redis, sleepers)
    # when the supervisor's beat reads that the host's row names the other
    last.beat = SupervisorBeat("w-second", False, False, False, False)
    await watch._step()

    # then the watch follows it, although the first still runs
    assert sleepers[0].poll() is None
    assert watch.current == second
