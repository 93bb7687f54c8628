"""The supervisor's watchers driven directly: a process that dies with no
exit note from its worker fails its task as `signal` once the grace has passed; one its worker
noted is left to the worker; one whose task moved on is left alone. Real processes, real
PostgreSQL and Redis; no other service runs."""

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.supervisor.error_logs import ErrorLogs
from services.supervisor.watchers import Watchers, WatchSettings
from shared.domain.messages import LogRecord, Severity
from shared.host.processes import create_time
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.integration

SETTINGS = WatchSettings(report_grace_s=0.3, vitals_s=0.2, kill_grace_s=0.5, follow_after_s=60.0)


@dataclass
class Running:
    """A task on_cpu under `claim`, its command a real process."""

    job_id: str
    task_id: str
    claim: uuid.UUID
    process: asyncio.subprocess.Process
    created: float


@pytest.fixture
async def keys(namespace: str) -> RedisKeys:
    return RedisKeys(namespace)


@pytest.fixture
async def watchers(pool: db.Pool, keys: RedisKeys) -> AsyncIterator[Watchers]:
    async with open_redis(REDIS_URL) as redis:
        watching = Watchers(pool, redis, keys, SETTINGS, None, ErrorLogs())
        yield watching
        await watching.close()


@pytest.fixture
async def running(pool: db.Pool) -> AsyncIterator[Running]:
    process = await asyncio.create_subprocess_exec("sleep", "30", start_new_session=True)
    created = create_time(process.pid)
    assert created is not None
    claim = uuid.uuid4()
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("w", "shell", "sleep 30", ["a"]))
        task_id = await conn.fetchval(
            "UPDATE tasks SET state = 'on_cpu', claim = $2, pid = $3, pid_create_time = $4,"
            " host = 'h' WHERE job_id = $1 RETURNING id",
            job.id,
            claim,
            process.pid,
            created,
        )
    yield Running(job.id, task_id, claim, process, created)
    if process.returncode is None:
        process.kill()
    await process.wait()


async def _watched_until_judged(watchers: Watchers, running: Running) -> None:
    """Watch, kill the process from outside, and wait until the watcher has judged its exit."""
    watchers.watch(
        running.task_id, running.job_id, running.claim, running.process.pid, running.created
    )
    running.process.send_signal(signal.SIGKILL)
    await running.process.wait()
    async with asyncio.timeout(10):
        while watchers.is_watching(running.task_id, running.claim):  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # (the watcher's task ends when it has judged)


async def test_a_process_that_dies_unreported_fails_its_task_as_signal(
    watchers: Watchers, running: Running, pool: db.Pool
) -> None:
    await _watched_until_judged(watchers, running)

    row = await pool.fetchrow("SELECT * FROM tasks WHERE id = $1", running.task_id)
    assert row is not None
    assert (row["state"], row["failure_class"], row["claim"]) == (
        "failed_on_cluster",
        "signal",
        None,
    )
    assert "without its worker reporting an exit" in row["error_brief"]


async def test_an_exit_its_worker_noted_is_left_to_the_worker(
    watchers: Watchers, running: Running, pool: db.Pool, keys: RedisKeys
) -> None:
    async with open_redis(REDIS_URL) as redis:
        await redis.hset(keys.job_exits(running.job_id), running.task_id, f"{running.claim} -9")

    await _watched_until_judged(watchers, running)

    state = await pool.fetchval("SELECT state FROM tasks WHERE id = $1", running.task_id)
    assert state == "on_cpu"  # the worker reports it (and fences it)


async def test_a_task_that_moved_on_meanwhile_is_left_alone(
    watchers: Watchers, running: Running, pool: db.Pool
) -> None:
    await pool.execute(
        "UPDATE tasks SET state = 'data_ready', claim = NULL WHERE id = $1", running.task_id
    )

    await _watched_until_judged(watchers, running)

    row = await pool.fetchrow(
        "SELECT state, failure_class FROM tasks WHERE id = $1", running.task_id
    )
    assert row is not None and (row["state"], row["failure_class"]) == ("data_ready", None)


async def _handed_over_and_followed(watchers: Watchers, running: Running) -> None:
    """Hand the process over as the worker does after `follow_after_s`; wait until followed."""
    watchers.watch(
        running.task_id,
        running.job_id,
        running.claim,
        running.process.pid,
        running.created,
        ran_s=SETTINGS.follow_after_s,  # the worker waited it out already
    )
    async with asyncio.timeout(5):  # not another follow_after_s (60 s) here
        while not watchers.is_following(running.task_id):  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # (nothing to await: the watcher loads it)


async def test_a_process_handed_over_after_follow_after_is_followed_at_once(
    watchers: Watchers, running: Running
) -> None:
    await _handed_over_and_followed(watchers, running)


async def test_an_error_logged_by_a_command_that_exited_keeps_the_exit_code_its_worker_noted(
    watchers: Watchers, running: Running, pool: db.Pool, keys: RedisKeys
) -> None:
    # given: a followed command whose worker noted its exit with code 3
    await _handed_over_and_followed(watchers, running)
    async with open_redis(REDIS_URL) as redis:
        await redis.hset(keys.job_exits(running.job_id), running.task_id, f"{running.claim} 3")

    # when: its error record reaches the supervisor before the worker's report
    await watchers.on_log(
        LogRecord(
            job_id=running.job_id,
            task_id=running.task_id,
            run_number=1,
            attempt=0,  # no cluster attempt row in this test
            line_no=1,
            severity=Severity.ERROR,
            stream="stdout",
            line="ERROR: no input",
        )
    )

    # then: the task fails on its error log, with the exit code beside the class
    row = await pool.fetchrow("SELECT * FROM tasks WHERE id = $1", running.task_id)
    assert row is not None
    assert (row["state"], row["failure_class"], row["exit_code"]) == (
        "failed_on_cluster",
        "error_log",
        3,
    )
