"""Emergency stop (design §8): suspend every active job and kill all running work, and undo it.

A stop is one transaction: the stop is recorded (who, when, why); every active job is
suspended; every task running a command (`on_cpu`) goes to `failed_on_cluster` with class
`cancelled` and a `KillTask` to its host's supervisor, through the outbox like a cancel. The
jobs and tasks it touched are recorded with it, so a resume brings back exactly those: the
jobs still suspended are resumed and the tasks still failed as `cancelled` are recovered
(`TaskAction.RECOVER`). Whatever someone changed in between is left as they left it.

Jobs submitted, activated or reopened while a stop is in force are suspended and belong to the
stop, and a single job's resume is refused (`shared.operations.stop_guard`). An advisory lock
orders them against stops and resumes, so no job slips between the stop's suspension and its commit.
"""

import logging
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final

import asyncpg

from shared.domain.actions import TaskAction
from shared.domain.errors import Conflict
from shared.domain.states import FailureClass, TaskState
from shared.operations import stop_guard, task_actions
from shared.store import attempts_repo, emergency_repo, tasks_repo
from shared.store.db import Connection

logger = logging.getLogger(__name__)

S = TaskState


@dataclass(frozen=True)
class Stop:
    """One emergency stop, with how many jobs it suspended and tasks it killed."""

    id: int
    stopped_by: str
    stopped_at: datetime
    reason: str
    resumed_by: str | None
    resumed_at: datetime | None
    jobs_suspended: int
    tasks_killed: int

    @classmethod
    def from_record(cls, record: Any) -> "Stop":
        data = dict(record)
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Resumed:
    """What a resume did: the stop (now closed), the jobs resumed, the tasks recovered."""

    stop: Stop
    jobs_resumed: list[str]
    tasks_recovered: list[str]


def kill_brief(actor: str, reason: str) -> str:
    """The `error_brief` of a task killed by a stop."""
    return f"emergency stop by {actor}: {reason}"


_RESUME_FIRST: Final = "resume it first (`vigil resume-all`, or POST /admin/resume)"


async def stop(conn: Connection, actor: str, reason: str) -> Stop:
    """Stop everything (see the module doc); raises `Conflict` if a stop is already in force."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", stop_guard.LOCK_KEY)
        current = await in_force(conn)
        if current is not None:
            raise Conflict(
                f"an emergency stop is already in force (by {current.stopped_by} at"
                f" {current.stopped_at.isoformat(timespec='seconds')}: {current.reason})",
                next_step=_RESUME_FIRST,
            )
        try:
            stop_id = await emergency_repo.record_stop(conn, actor, reason)
        except asyncpg.UniqueViolationError as exc:  # only without the lock: belt and braces
            raise Conflict(
                "an emergency stop is already in force", next_step=_RESUME_FIRST
            ) from exc
        jobs = await emergency_repo.suspend_active_jobs(conn, stop_id)
        killed = await _kill_running_tasks(conn, stop_id, kill_brief(actor, reason))
        logger.warning(
            "emergency stop by %s: %d job(s) suspended, %d running task(s) killed: %s",
            actor,
            jobs,
            killed,
            reason,
            extra={"action": "emergency_stop", "user": actor},
        )
        return await _get(conn, stop_id)


async def resume(conn: Connection, actor: str) -> Resumed:
    """Undo the stop in force (see the module doc); raises `Conflict` if there is none."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", stop_guard.LOCK_KEY)
        current = await in_force(conn)
        if current is None:
            raise Conflict(
                "no emergency stop is in force", next_step="nothing to resume: work goes on"
            )
        # lifted first: a job that recovering reopens must not be held by this stop again
        await emergency_repo.record_lifted(conn, current.id, actor)
        jobs = await emergency_repo.resume_jobs(conn, current.id)
        tasks = await _recover_tasks(conn, current.id, actor)
        logger.warning(
            "emergency stop %d resumed by %s: %d job(s) resumed, %d task(s) recovered",
            current.id,
            actor,
            len(jobs),
            len(tasks),
            extra={"action": "emergency_resume", "user": actor},
        )
        return Resumed(await _get(conn, current.id), jobs, tasks)


async def in_force(conn: Connection) -> Stop | None:
    """The stop in force, or None."""
    stop_id = await emergency_repo.in_force_id(conn)
    return await _get(conn, stop_id) if stop_id is not None else None


async def latest(conn: Connection) -> Stop | None:
    """The most recent stop, in force or resumed; None if there never was one."""
    stop_id = await conn.fetchval("SELECT max(id) FROM emergency_stops")
    return await _get(conn, stop_id) if stop_id is not None else None


async def _get(conn: Connection, stop_id: int) -> Stop:
    record = await conn.fetchrow(
        "SELECT s.*,"
        " (SELECT count(*) FROM emergency_stop_jobs j WHERE j.stop_id = s.id) AS jobs_suspended,"
        " (SELECT count(*) FROM emergency_stop_tasks t WHERE t.stop_id = s.id) AS tasks_killed"
        " FROM emergency_stops s WHERE s.id = $1",
        stop_id,
    )
    assert record is not None  # ids come from the table, which is never deleted from
    return Stop.from_record(record)


async def _kill_running_tasks(conn: Connection, stop_id: int, brief: str) -> int:
    """Every `on_cpu` task: killed through its supervisor and failed as `cancelled`."""
    killed = []
    for task in await tasks_repo.lock_on_cpu(conn):
        await task_actions.kill_running(conn, task, brief)
        await attempts_repo.close_open(
            conn, task.id, S.FAILED_ON_CLUSTER.value, FailureClass.CANCELLED, brief
        )
        # The claim goes: the worker's late report of the killed command is fenced off.
        changes = {
            "claim": None,
            "worker": None,
            "failure_class": FailureClass.CANCELLED,
            "error_brief": brief,
        }
        await tasks_repo.transition(
            conn, task.id, S.FAILED_ON_CLUSTER, among=frozenset({S.ON_CPU}), changes=changes
        )
        killed.append(task.id)
    await emergency_repo.record_killed(conn, stop_id, killed)
    return len(killed)


async def _recover_tasks(conn: Connection, stop_id: int, actor: str) -> list[str]:
    """Recover the tasks the stop killed that are still failed as `cancelled` by it."""
    rows = await conn.fetch(
        "SELECT t.id FROM emergency_stop_tasks s JOIN tasks t ON t.id = s.task_id"
        " WHERE s.stop_id = $1 AND t.state = 'failed_on_cluster'"
        " AND t.failure_class = 'cancelled' ORDER BY t.id",
        stop_id,
    )
    recovered = []
    for row in rows:
        try:
            await task_actions.apply_to_task(conn, row["id"], TaskAction.RECOVER, actor)
        except Conflict as exc:  # e.g. its job was cancelled meanwhile: leave it as it is
            logger.info("task %s not recovered after the emergency stop: %s", row["id"], exc)
            continue
        recovered.append(row["id"])
    return recovered
