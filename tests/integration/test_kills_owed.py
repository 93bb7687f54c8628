"""Kills owed: a command whose attempt someone else ended (a cancel, a task
declared lost) is killed by its host's supervisor at its reconcile, and recorded gone, whatever
became of the `KillTask` sent for it: here each one is dead-lettered, as after five failed
deliveries, and read by the scheduler's dead-letter handler. Real commands, the real
PostgreSQL and Redis; the supervisor's reconcile round as the service runs it."""

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.scheduler import dead_letters
from services.scheduler.triage import Triage, TriageSettings
from services.supervisor.error_logs import ErrorLogs
from services.supervisor.freezes import Suspensions
from services.supervisor.reconcile import reconcile
from services.supervisor.watchers import Watchers, WatchSettings
from services.worker import process
from shared.domain.actions import TaskAction
from shared.domain.analyser import DefaultAnalyser
from shared.domain.messages import KillTask, decode
from shared.host import marks
from shared.host.processes import create_time
from shared.messaging.presence import WorkerIdentity, announce
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.operations import loss, task_actions
from shared.store import attempts_repo, db, jobs_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.integration

#: How long a command the supervisor killed may take to be seen gone (it dies at once).
GONE_WITHIN_S = 10.0


class Host:
    """One host's supervisor, as far as its reconcile goes: a host row with fresh heartbeats
    (reachable: the triage waits for its supervisor rather than its fence timeout)."""

    def __init__(self, pool: db.Pool, watchers: Watchers, namespace: str, host_id: str) -> None:
        self.pool, self.watchers, self.namespace, self.id = pool, watchers, namespace, host_id
        self.keys = RedisKeys(namespace)
        self.suspensions = Suspensions()

    async def reconcile(self) -> None:
        """One reconcile round of its supervisor."""
        await reconcile(
            self.pool,
            self.watchers._redis,
            self.keys,
            self.watchers,
            self.id,
            self.namespace,
            None,
            self.suspensions,
        )


@pytest.fixture
async def host(pool: db.Pool, namespace: str) -> AsyncIterator[Host]:
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    await pool.execute(
        "INSERT INTO hosts (id, slots, heartbeat_at, supervisor_heartbeat_at)"
        " VALUES ($1, 1, now(), now())",
        host_id,
    )
    settings = WatchSettings(report_grace_s=0.5, vitals_s=0.2, kill_grace_s=0.5)
    async with open_redis(REDIS_URL) as redis:
        watchers = Watchers(pool, redis, RedisKeys(namespace), settings, None, ErrorLogs())
        yield Host(pool, watchers, namespace, host_id)
        await watchers.close()


@pytest.fixture
async def commands() -> AsyncIterator[list[process.Running]]:
    """The commands a test starts, killed at its end whatever happened."""
    started: list[process.Running] = []
    yield started
    for running in started:
        if running.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.pid, signal.SIGKILL)
            await running.process.wait()


async def _running_task(
    pool: db.Pool,
    host: Host,
    commands: list[process.Running],
    workdir: Path,
    script: str,
    **policy: Any,
) -> tuple[tasks_repo.Task, process.Running]:
    """Given-step: a task `on_cpu` on `host`, its command started as a worker starts one
    (its own session, `VIGIL_MARK` in its environment), its cluster attempt open."""
    claim = uuid.uuid4()
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(
            conn, user.id, NewJob("k", "shell", script, ["a"], policy=policy)
        )
        [task] = await tasks_repo.list_for_job(conn, job.id)
    mark = marks.mark(host.namespace, host.id, task.id, claim)
    running = await process.spawn(script, workdir, {marks.VARIABLE: mark})
    commands.append(running)
    running.open_gate()
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE tasks SET state = 'on_cpu', claim = $2, host = $3, worker = $3 || '-w',"
            " pid = $4, pid_create_time = $5, attempt = 1 WHERE id = $1",
            task.id,
            claim,
            host.id,
            running.pid,
            running.create_time,
        )
        await conn.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker, claim, pid)"
            " VALUES ($1, 1, 1, 'cluster', $2, $2 || '-w', $3, $4)",
            task.id,
            host.id,
            claim,
            running.pid,
        )
        moved = await tasks_repo.get(conn, task.id)
    assert moved is not None
    return moved, running


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(GONE_WITHIN_S):
        while not check():  # noqa: ASYNC110  (a process of no parent's: no event to wait on)
            await asyncio.sleep(0.01)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def _dead_letter_kills(pool: db.Pool, task_id: str) -> list[KillTask]:
    """The `KillTask`s written for the task, dead-lettered (their deliveries all failed): the
    scheduler's dead-letter handler records each, and nobody delivers them."""
    rows = await pool.fetch(
        "DELETE FROM outbox WHERE exchange = 'work' AND body->>'task_id' = $1"
        " RETURNING body::text AS body",
        task_id,
    )
    kills = [decode(r["body"]) for r in rows]
    for kill in kills:
        assert isinstance(kill, KillTask)
        await dead_letters.handle(pool, kill)
    return [k for k in kills if isinstance(k, KillTask)]


async def _reaped_at(pool: db.Pool, task_id: str) -> object:
    return await pool.fetchval(
        "SELECT reaped_at FROM attempts WHERE task_id = $1 AND stage = 'cluster'", task_id
    )


async def test_a_cancelled_command_whose_kill_order_died_is_killed_by_its_supervisor(
    pool: db.Pool, host: Host, commands: list[process.Running], tmp_path: Path
) -> None:
    # a command that drops its environment (its mark with it): the stray sweep cannot see it
    task, running = await _running_task(pool, host, commands, tmp_path, "exec env -i sleep 600")
    await _until(lambda: _cmdline(running.pid) == b"sleep\x00600\x00")

    # when: the task is cancelled, and the kill order for it is dead-lettered
    async with pool.acquire() as conn:
        await task_actions.apply_to_task(conn, task.id, TaskAction.CANCEL, "alice")
    [kill] = await _dead_letter_kills(pool, task.id)
    assert kill.pid == running.pid

    # then: its supervisor's next reconcile kills it, and records it gone
    await host.reconcile()
    async with asyncio.timeout(GONE_WITHIN_S):
        assert await running.process.wait() == -9
    assert await _reaped_at(pool, task.id) is not None
    brief = await pool.fetchval(
        "SELECT brief FROM job_errors WHERE task_id = $1 AND severity = 'dead_letter'", task.id
    )
    assert "kills what is left of the command at its next reconcile" in brief


async def test_a_lost_task_whose_fencing_kill_died_is_fenced_and_resubmitted(
    pool: db.Pool, host: Host, commands: list[process.Running], tmp_path: Path
) -> None:
    task, running = await _running_task(
        pool, host, commands, tmp_path, "sleep 600", restartable=True
    )
    triage = Triage(
        pool,
        {"default": DefaultAnalyser(rand=lambda: 1.0)},
        TriageSettings(
            batch=100,
            fence_timeout_s=600,
            quarantine_after=0,
            quarantine_window_s=600,
            quarantine_s=600,
        ),
    )
    # given: the task declared lost while its host is reachable (its worker seen silent), so
    # the triage asks the host to kill the command before it resubmits the task...
    async with pool.acquire() as conn:
        assert await loss.declare(conn, task, why="worker silent")
    await triage.run_once()
    # ...and that order is dead-lettered
    [kill] = await _dead_letter_kills(pool, task.id)
    assert kill.reason.startswith("lost")

    # when: the host's supervisor reconciles, and the triage looks again
    await host.reconcile()
    async with asyncio.timeout(GONE_WITHIN_S):
        assert await running.process.wait() == -9
    await triage.run_once()

    # then: the command is recorded gone, and the task resubmitted (it waited for ever)
    assert await _reaped_at(pool, task.id) is not None
    async with pool.acquire() as conn:
        decided = await tasks_repo.get(conn, task.id)
    assert decided is not None and decided.decided and decided.superseded_by is not None


async def test_a_pid_taken_by_another_process_is_never_killed_and_the_kill_is_recorded_done(
    pool: db.Pool, host: Host, commands: list[process.Running], tmp_path: Path
) -> None:
    task, running = await _running_task(pool, host, commands, tmp_path, "exit 0")
    async with asyncio.timeout(GONE_WITHIN_S):
        await running.process.wait()
    other = await asyncio.create_subprocess_exec("sleep", "600", start_new_session=True)
    try:
        # the command is gone; its pid now names a process of someone else
        created = create_time(other.pid)
        assert created is not None
        await pool.execute("UPDATE attempts SET pid = $2 WHERE task_id = $1", task.id, other.pid)
        await pool.execute(  # (the command started a while before it)
            "UPDATE tasks SET pid = $2, pid_create_time = $3 WHERE id = $1",
            task.id,
            other.pid,
            created - 60,
        )
        async with pool.acquire() as conn:
            await task_actions.apply_to_task(conn, task.id, TaskAction.CANCEL, "alice")
        await _dead_letter_kills(pool, task.id)

        await host.reconcile()

        assert other.returncode is None and create_time(other.pid) == created
        assert await _reaped_at(pool, task.id) is not None
    finally:
        if other.returncode is None:
            other.kill()
        await other.wait()


async def test_the_supervisors_read_goes_through_the_index_of_the_kills_owed(
    pool: db.Pool,
) -> None:
    # the read's predicate and migration 0035's index name the same classes, so that the read
    # costs the few rows owed, never the host's whole history of attempts
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = await conn.fetch("EXPLAIN " + attempts_repo._KILLS_OWED, "h-1")
    assert "attempts_kill_owed" in "\n".join(r[0] for r in plan)


def _run_state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


async def test_a_command_whose_suspend_or_resume_order_died_is_stopped_then_continued(
    pool: db.Pool, host: Host, commands: list[process.Running], tmp_path: Path
) -> None:
    # given: a running command of the host's live worker whose job is suspended, its
    # FreezeTask lost (never delivered)
    task, running = await _running_task(pool, host, commands, tmp_path, "sleep 600")
    await _until(lambda: _cmdline(running.pid) == b"sleep\x00600\x00")
    me = WorkerIdentity(f"{host.id}-w", os.getpid(), create_time(os.getpid()) or 0.0)
    await announce(host.watchers._redis, host.keys, host.id, me)
    await pool.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", task.job_id)

    # when / then: its supervisor's reconciles stop it, the second that sees it running (the
    # first may have read the job a moment before an order that was being done)...
    await host.reconcile()
    assert _run_state(running.pid) != "T"
    await host.reconcile()
    await _until(lambda: _run_state(running.pid) == "T")

    # ...and, the job resumed with its order lost again, continue it
    await pool.execute("UPDATE jobs SET state = 'active' WHERE id = $1", task.job_id)
    await host.reconcile()
    assert _run_state(running.pid) == "T"
    await host.reconcile()
    await _until(lambda: _run_state(running.pid) != "T")
    assert running.process.returncode is None
