"""Releasing tasks to hosts: claim (compare-and-set) and a work message, in one transaction.

New tasks are placed by the shared pool's policy (`planning.py`): on a host with
free capacity for their request, by fair share between users, priority and age within a
user, best fit, backfill and reservations, within each job's `max_in_flight` (1 while the
job is probing) and the per-user cap (`VIGIL_MAX_IN_FLIGHT_PER_USER`); a configuring job's
test tasks are placed the same way. Each goes to its host's queue. Unclaimed tasks resting
in `queued` or `data_ready` (after a recovery, or once post-processing prerequisites are
met), or in an action state (`recover_*`, `restart_*`: a hook to run), go to their host's
queue too, since their work dir lives there (`release_round.py`).
"""

from dataclasses import dataclass
from typing import Final

from services.scheduler.planning import Planning
from shared.domain.scheduling.model import Settings
from shared.store import release_round
from shared.store.db import GENERIC_PLANS, BegunWith, Pool

#: The round's memory for a sort or a hash, for the rest of its transaction: its sums of what
#: the tasks in flight hold (`pool_repo.HELD_BY_HOST_AND_OWNER`) hash every task in flight,
#: and within the default 4 MB a thousand hosts' 16,000 tasks spilled to disk (30 against 22
#: ms a look). One round at a time, on the leader's one connection.
ROUND_MEMORY: Final = "set_config('work_mem', '16MB', true)"


@dataclass(frozen=True)
class Dispatched:
    """What a round's release did: how many tasks it released, whether any task was waiting
    to be (true when it released some: what it saw waiting was read before its claims), and
    the jobs it saw with a task to place (unfinished when the round began)."""

    released: int
    waiting: bool
    unfinished: frozenset[str] = frozenset()


class Dispatcher:
    """Places new tasks and releases resting ones, writing their work messages to the outbox."""

    def __init__(
        self,
        pool: Pool,
        batch: int,
        worker_pool: str,
        per_user: int | None = None,
        *,
        policy: Settings | None = None,
        fresh_s: float = 10.0,
        short_prefetch: int = 0,
        short_task_s: float = 0.5,
    ) -> None:
        self._pool, self._batch = pool, batch
        self._query = release_round.statement()
        policy = policy or Settings()
        self.planning = Planning(
            worker_pool,
            policy,
            fresh_s,
            batch,
            per_user,
            prefetch=policy.prefetch,
            short_prefetch=short_prefetch,
            short_task_s=short_task_s,
        )

    async def run_once(self) -> Dispatched:
        """Place new tasks (`Planning.run_once`) and release one batch of resting ones, in one
        transaction."""
        # one plan per connection for each statement, and the round's memory, asked for in
        # the BEGIN's message
        begin = f"SELECT {GENERIC_PLANS}, {ROUND_MEMORY}"
        async with self._pool.acquire() as conn, BegunWith(conn, begin):
            placed = await self.planning.run_once(conn)
            rested = await release_round.release(conn, self._query, self._batch)
        return Dispatched(
            placed.claimed + rested.released,
            rested.waiting or placed.waiting_jobs > 0 or placed.claimed > 0,
            placed.seen,
        )
