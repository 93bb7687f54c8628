"""Releasing tasks to workers: claim (compare-and-set) and a work message, in one statement.

New tasks whose setup prerequisites are met (and whose resubmission backoff, `not_before`, has
passed) go to the pool queue, within each job's `release_per_tick` and `max_in_flight` (1 while
the job is probing) and their owner's share (users interleaved, each within the per-user cap
on tasks in flight, `VIGIL_MAX_IN_FLIGHT_PER_USER`); a configuring job has only test tasks,
released the same way. Unclaimed
tasks resting in `queued` or `data_ready`
(after a recovery, or once post-processing prerequisites are met), or in an action state
(`recover_*`, `restart_*`: a hook to run), go to their host's queue, since their work dir
lives there.
"""

from shared.messaging.topology import pool_key
from shared.store import release_round
from shared.store.db import Pool


class Dispatcher:
    """Claims releasable tasks and writes their work messages to the outbox."""

    def __init__(
        self, pool: Pool, batch: int, worker_pool: str, per_user: int | None = None
    ) -> None:
        self._pool, self._batch, self._per_user = pool, batch, per_user
        self._pool_key = pool_key(worker_pool)
        self._query = release_round.statement()

    async def run_once(self) -> release_round.Released:
        """Release one batch of new tasks and one of resting tasks (one statement, with
        nothing to release too, in a transaction that keeps its plan: `release_round.release`):
        how many, and whether any task was waiting."""
        async with self._pool.acquire() as conn:
            return await release_round.release(
                conn, self._query, self._batch, self._pool_key, self._per_user
            )
