"""The worker's log shipper against the real PostgreSQL, RabbitMQ and Redis: what a task shows
as its progress once its command has ended."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.worker.log_shipper import LogShipper
from shared.domain.messages import LogRecord
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology
from shared.store import db, jobs_repo, logs_repo, tasks_repo, users_repo
from shared.store.db import Connection
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL

pytestmark = pytest.mark.integration


@pytest.fixture
async def broker(namespace: str) -> AsyncIterator[Broker]:
    async with open_broker(AMQP_URL, Topology(namespace), name="test-log-shipper") as opened:
        yield opened


async def _task(pool: db.Pool) -> tuple[str, str]:
    """Given-step: a job of one task; (job id, task id)."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("s", "shell", "true", ["a"]))
        task_id = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", job.id)
    return job.id, task_id


def _shipper(
    pool: db.Pool, broker: Broker, redis: Redis, namespace: str, workdir: Path, ids: tuple[str, str]
) -> LogShipper:
    """A shipper of run 1, attempt 1 of the task, flushing every 10 ms."""
    return LogShipper(
        pool=pool,
        broker=broker,
        redis=redis,
        keys=RedisKeys(namespace),
        job_id=ids[0],
        task_id=ids[1],
        run_number=1,
        attempt=1,
        workdir=workdir,
        files={"stdout": workdir / "run1.stdout", "stderr": workdir / "run1.stderr"},
        flush_every_s=0.01,
    )


async def test_when_the_command_ends_during_a_periodic_flush__its_last_progress_is_kept(
    pool: db.Pool,
    broker: Broker,
    redis: Redis,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: a shipper whose periodic flush stored PROGRESS: 50, then is writing PROGRESS: 100
    job_id, task_id = await _task(pool)
    shipper = _shipper(pool, broker, redis, namespace, tmp_path, (job_id, task_id))
    stored, writing, go_on = asyncio.Event(), asyncio.Event(), asyncio.Event()
    set_progress = tasks_repo.set_progress

    async def slow_set_progress(conn: Connection, task: str, progress: int) -> None:
        if stored.is_set():
            writing.set()
            await go_on.wait()  # the database is slow to take this one
        await set_progress(conn, task, progress)
        stored.set()

    monkeypatch.setattr(tasks_repo, "set_progress", slow_set_progress)
    shipper.add("stdout", "PROGRESS: 50")
    await asyncio.wait_for(stored.wait(), 10)
    shipper.add("stdout", "PROGRESS: 100")
    await asyncio.wait_for(writing.wait(), 10)

    # when: the command ends meanwhile (its output drained: the shipper is closed)
    closing = asyncio.create_task(shipper.close())
    await asyncio.sleep(0)  # close() starts while the flush is under way
    go_on.set()
    await asyncio.wait_for(closing, 10)

    # then: the task shows the last progress it printed, and every line is stored
    assert await pool.fetchval("SELECT progress FROM tasks WHERE id = $1", task_id) == 100
    lines = await pool.fetch("SELECT line FROM logs WHERE task_id = $1 ORDER BY seq", task_id)
    assert [r["line"] for r in lines] == ["PROGRESS: 50", "PROGRESS: 100"]


async def test_when_a_flush_meets_the_database_away__its_progress_is_written_with_the_retry(
    pool: db.Pool,
    broker: Broker,
    redis: Redis,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: the first insert of lines fails as a restarting database makes it
    ids = await _task(pool)
    shipper = _shipper(pool, broker, redis, namespace, tmp_path, ids)
    insert = logs_repo.insert_splitting
    refused = asyncio.Event()

    async def away_once(conn: Connection, records: list[LogRecord]) -> list[LogRecord]:
        if not refused.is_set():
            refused.set()
            raise ConnectionResetError("the database restarts")
        return await insert(conn, records)

    monkeypatch.setattr(logs_repo, "insert_splitting", away_once)

    # when: the progress line's flush fails, and a line without progress comes after it
    shipper.add("stdout", "PROGRESS: 70")
    await asyncio.wait_for(refused.wait(), 10)
    shipper.add("stdout", "working")
    await shipper.close()

    # then: the progress went with the lines kept for the retry
    assert await pool.fetchval("SELECT progress FROM tasks WHERE id = $1", ids[1]) == 70
