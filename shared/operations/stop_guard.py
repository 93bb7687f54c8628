"""What keeps work from starting while an emergency stop is in force
(`shared.operations.emergency`).

A stop and its lifting hold an advisory lock exclusively; whoever could make a job active
(a submission, an activation, a resume, a job reopened by a recovery, a duplicate or an
appended input; the triage, whose fail_fast cancels) holds it shared, so either the stop came
first and is seen, or it waits and then suspends what was made active. Every such transaction
takes it (`share`) as its first lock: the stop, holding it, waits on job and task rows, so a
transaction that took a row lock first and then waited here would deadlock with it.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

from shared.domain.errors import Conflict
from shared.store import emergency_repo
from shared.store.db import GENERIC_PLANS, BegunWith, Connection

#: Advisory lock: exclusive for a stop or a resume, shared for anything that activates a job.
LOCK_KEY: Final = 0x56494745  # "VIGE"


async def share(conn: Connection, *, generic_plans: bool = False) -> None:
    """Hold the stop lock shared until the transaction ends; with `generic_plans`, the
    transaction's statements keep one plan each (`db.GENERIC_PLANS`), in the same round
    trip."""
    also = f", {GENERIC_PLANS}" if generic_plans else ""
    await conn.execute(f"SELECT pg_advisory_xact_lock_shared($1){also}", LOCK_KEY)


@dataclass(frozen=True)
class Guard:
    """What a transaction begun by `guarded` read of the stops, under the lock."""

    #: Whether a stop was in force (its id is read only then: `hold`).
    stopped: bool

    async def hold(self, conn: Connection, job_id: str) -> bool:
        """`hold_if_stopped` in the guarded transaction: nothing to read or do unless a
        stop was in force."""
        if not self.stopped:
            return False
        return await hold_under(conn, await emergency_repo.in_force_id(conn), job_id)


@asynccontextmanager
async def guarded(conn: Connection, *, generic_plans: bool = False) -> AsyncIterator[Guard]:
    """A transaction that holds the stop lock shared from its first statement, and knows
    whether a stop is in force: its `BEGIN`, the lock and the stops' read go in one round trip
    (three statements in one message, PostgreSQL's simple protocol; the read, a statement of its
    own, reads a snapshot taken after the lock was granted, so it sees a stop committed
    while the lock was awaited). `generic_plans`: as `share`. For a writer that makes jobs
    active at the rate users submit (a submission): the `BEGIN` and the read were round trips
    of their own."""
    also = f", {GENERIC_PLANS}" if generic_plans else ""
    first = f"SELECT pg_advisory_xact_lock_shared({LOCK_KEY}){also}; {emergency_repo.IN_FORCE}"
    transaction = BegunWith(conn, first)  # `BEGIN` in the same message
    async with transaction:
        # the read's status counts its rows: "SELECT 1" while a stop is in force (at most
        # one is: `emergency_stops_in_force`)
        yield Guard(stopped=transaction.status != "SELECT 0")


async def hold_if_stopped(conn: Connection, job_id: str) -> bool:
    """Suspend `job_id`, just made active, if a stop is in force (the stop's lifting resumes
    it); True if it did. Call in the transaction that made it active."""
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
