"""Stop an installation's pilots (`python -m services.scheduler.stop_pilots`; `scripts/down`
runs it before it stops the services): every pilot not ended is withdrawn, as `vigil pilots
rm` does, and its batch job cancelled at once, not left to the scheduler that is about to stop.
A pilot left running would keep its allocation (and the CPUs of the site's users) until its
walltime, for a Vigil that no longer places anything on it.

It says what it did, one line a pilot, and what it could not: a batch job it could not cancel
lives until its allocation ends, and it says when. Its exit status is 0 when every pilot is
stopped or none was live, 1 otherwise (the operator has something to cancel by hand).
"""

import asyncio
import os
import sys
from dataclasses import dataclass

from services.scheduler.pilots import BatchSystem
from shared.batch.slurm import BatchError, Slurm
from shared.domain.errors import UNAVAILABLE
from shared.store import db, pilots_repo
from shared.store.pilots_repo import Pilot

#: Why the pilots are withdrawn (their `reason` once ended).
WHY: str = "the installation was stopped (scripts/down)"


@dataclass(frozen=True)
class Stopped:
    """What became of one pilot: cancelled, or why not and until when it lives."""

    pilot: Pilot
    error: str | None = None

    def line(self) -> str:
        p = self.pilot
        job = f"batch job {p.batch_job_id}" if p.batch_job_id else "never submitted"
        if self.error is None:
            return f"pilot {p.id} ({job}): cancelled"
        return f"pilot {p.id} ({job}) not cancelled: {self.error}; {_lives_until(p)}"


def _lives_until(pilot: Pilot) -> str:
    """Until when a pilot left in the batch system keeps its allocation."""
    if pilot.ends_at is not None:
        return f"it lives until {pilot.ends_at.astimezone().strftime('%Y-%m-%d %H:%M:%S %Z')}"
    return f"it may start, and then lives up to its walltime ({pilot.walltime_s} s)"


async def stop(conn: db.Connection, batch: BatchSystem) -> list[Stopped]:
    """Withdraw every live pilot and cancel its batch job; what became of each."""
    done: list[Stopped] = []
    for pilot in await pilots_repo.listed(conn, live=True):
        await pilots_repo.withdraw(conn, pilot.id, WHY)
        if pilot.batch_job_id is None:  # never submitted: ended by its withdrawal
            done.append(Stopped(pilot))
            continue
        try:
            await batch.cancel(pilot.batch_job_id)
        except BatchError as exc:
            done.append(Stopped(pilot, str(exc)))
        else:
            done.append(Stopped(pilot))
    return done


async def _main(database_url: str) -> int:
    async with db.open_pool(database_url, max_size=1) as pool, pool.acquire() as conn:
        done = await stop(conn, Slurm())
    for one in done:
        sys.stdout.write(one.line() + "\n")
    if not done:
        sys.stdout.write("no pilot is live\n")
    return 0 if all(one.error is None for one in done) else 1


def main() -> int:
    url = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        return asyncio.run(_main(url))
    except UNAVAILABLE as exc:
        sys.stderr.write(
            f"the pilots were not stopped: the database cannot be reached ({exc}); a pilot"
            " lives until its walltime ends (VIGIL_PILOTS_WALLTIME_S, 3600 s by default):"
            " `squeue --name=vigil-p-...` lists them, `scancel` ends them\n"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
