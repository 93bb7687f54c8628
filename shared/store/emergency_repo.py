"""Emergency stops (`emergency_stops`, `emergency_stop_jobs`, `emergency_stop_tasks`, design §8):
every write to them lives here, and so do the changes of `jobs.state` a stop makes together
with its record (the jobs it suspends and resumes). Every function is called with the stop's
advisory lock held by the caller (`shared.operations.stop_guard.LOCK_KEY`: exclusive for a stop
and its lifting, shared for a writer that may make a job active); each UPDATE holds the row
locks of the jobs it changes until the transaction ends.
"""

from typing import Final

from shared.store.db import Connection

#: The id of the stop in force, if any. At most one is in force (`emergency_stops_in_force`).
IN_FORCE: Final = "SELECT id FROM emergency_stops WHERE resumed_at IS NULL"


async def in_force_id(conn: Connection) -> int | None:
    """The id of the stop in force, or None. Locks: none (the caller holds the stop lock
    shared or exclusively, so that the answer holds until its transaction ends)."""
    stop_id: int | None = await conn.fetchval(IN_FORCE)
    return stop_id


async def record_stop(conn: Connection, actor: str, reason: str) -> int:
    """A new stop in force; its id (`UniqueViolationError` if one is in force already).
    Locks: none beyond the row it inserts; the caller holds the stop lock exclusively."""
    stop_id: int = await conn.fetchval(
        "INSERT INTO emergency_stops (stopped_by, reason) VALUES ($1, $2) RETURNING id",
        actor,
        reason,
    )
    return stop_id


async def record_lifted(conn: Connection, stop_id: int, actor: str) -> None:
    """The stop is lifted, by `actor`, now. Locks: the stop's row (its UPDATE); the caller
    holds the stop lock exclusively."""
    await conn.execute(
        "UPDATE emergency_stops SET resumed_by = $2, resumed_at = now() WHERE id = $1",
        stop_id,
        actor,
    )


async def suspend_active_jobs(conn: Connection, stop_id: int) -> int:
    """Suspend every active job, each recorded as the stop's; how many. Locks: every active
    job's row (its UPDATE, in no set order), under the caller's exclusive stop lock."""
    status = await conn.execute(
        "WITH suspended AS (UPDATE jobs SET state = 'suspended' WHERE state = 'active'"
        " RETURNING id) INSERT INTO emergency_stop_jobs (stop_id, job_id)"
        " SELECT $1, id FROM suspended",
        stop_id,
    )
    return int(status.split()[-1])


async def hold_job(conn: Connection, stop_id: int, job_id: str) -> None:
    """Suspend `job_id` if it is active (made active while the stop is in force), recorded as
    the stop's, so that the stop's lifting resumes it. Locks: the job's row if active (its
    UPDATE), under the caller's shared stop lock."""
    await conn.execute(
        "WITH held AS (UPDATE jobs SET state = 'suspended' WHERE id = $2 AND state = 'active'"
        " RETURNING id) INSERT INTO emergency_stop_jobs (stop_id, job_id)"
        " SELECT $1, id FROM held ON CONFLICT DO NOTHING",
        stop_id,
        job_id,
    )


async def record_killed(conn: Connection, stop_id: int, task_ids: list[str]) -> None:
    """The tasks the stop killed (its lifting recovers those still failed by it). Locks: none
    beyond the rows it inserts (the caller holds the tasks' rows and the stop lock)."""
    await conn.execute(
        "INSERT INTO emergency_stop_tasks (stop_id, task_id) SELECT $1, unnest($2::text[])",
        stop_id,
        task_ids,
    )


async def resume_jobs(conn: Connection, stop_id: int) -> list[str]:
    """Make active again the jobs the stop suspended that are still suspended; their ids.
    Locks: the rows of the jobs it resumes (its UPDATE, in no set order), under the caller's
    exclusive stop lock."""
    rows = await conn.fetch(
        "UPDATE jobs SET state = 'active' WHERE state = 'suspended' AND id IN"
        " (SELECT job_id FROM emergency_stop_jobs WHERE stop_id = $1) RETURNING id",
        stop_id,
    )
    return sorted(r["id"] for r in rows)
