"""What keeps work from starting while an emergency stop is in force
(`shared.operations.emergency`).

A stop and its lifting hold an advisory lock exclusively; whoever could make a job active
(a submission, an activation, a resume, a job reopened by a recovery, a duplicate or an
appended input; the triage, whose fail_fast cancels) holds it shared, so either the stop came
first and is seen, or it waits and then suspends what was made active. Every such transaction
takes it (`share`) as its first lock: the stop, holding it, waits on job and task rows, so a
transaction that took a row lock first and then waited here would deadlock with it.
"""

from typing import Final

from shared.domain.errors import Conflict
from shared.store import emergency_repo
from shared.store.db import GENERIC_PLANS, Connection

#: Advisory lock: exclusive for a stop or a resume, shared for anything that activates a job.
LOCK_KEY: Final = 0x56494745  # "VIGE"


async def share(conn: Connection, *, generic_plans: bool = False) -> None:
    """Hold the stop lock shared until the transaction ends; with `generic_plans`, the
    transaction's statements keep one plan each (`db.GENERIC_PLANS`), in the same round
    trip."""
    also = f", {GENERIC_PLANS}" if generic_plans else ""
    await conn.execute(f"SELECT pg_advisory_xact_lock_shared($1){also}", LOCK_KEY)


async def hold_if_stopped(conn: Connection, job_id: str, *, shared: bool = False) -> bool:
    """Suspend `job_id`, just made active, if a stop is in force (the stop's lifting resumes
    it); True if it did. Call in the transaction that made it active; `shared`: that
    transaction took the lock first already (`share`)."""
    if not shared:
        await share(conn)
    return await hold_under(conn, await emergency_repo.in_force_id(conn), job_id)


async def hold_under(conn: Connection, stop_id: int | None, job_id: str) -> bool:
    """Suspend `job_id`, just made active, as the stop `stop_id`'s (None: no stop, nothing
    to do); True if there was a stop. The caller holds the lock (`share`) and read `stop_id`
    under it (`emergency_repo.in_force_id`)."""
    if stop_id is None:
        return False
    await emergency_repo.hold_job(conn, stop_id, job_id)
    return True


async def refuse_if_stopped(conn: Connection, doing: str) -> None:
    """Raise `Conflict` naming the stop when one is in force: nothing resumes but through its
    lifting (which resumes the jobs the stop suspended)."""
    await share(conn)
    stop = await conn.fetchrow(
        "SELECT stopped_by, reason FROM emergency_stops WHERE resumed_at IS NULL"
    )
    if stop is not None:
        raise Conflict(
            f"cannot {doing}: an emergency stop by {stop['stopped_by']} is in force"
            f" ({stop['reason']})",
            next_step="an operator lifts it (`vigil resume-all`, or POST /admin/resume)",
        )
