"""Pruning what is kept for a while: the event history past its retention (and the charts'
per-minute counts with it), the logs of jobs ended long ago.

Rows go in batches, each its own short statement (no lock is held long), and one prune deletes
at most `MAX_BATCHES` batches of each kind: a backlog is worked off over the next prunes
rather than holding up the scheduling round.
"""

from collections.abc import Awaitable, Callable
from typing import Final

from services.scheduler.settings import SchedulerSettings
from shared.store import activity, event_log, logs_repo
from shared.store.db import Pool

#: Rows one batch deletes.
BATCH: Final = 5000
#: Batches of each kind one prune deletes at most.
MAX_BATCHES: Final = 20


async def prune(pool: Pool, settings: SchedulerSettings) -> int:
    """One prune of every kind; returns how many events went."""
    async with pool.acquire() as conn:
        gone = await _in_batches(
            lambda: event_log.prune(conn, settings.event_retention_s, batch=BATCH)
        )
        await logs_repo.prune_ended_jobs(conn, settings.log_retention_s)
        await activity.prune(conn, settings.event_retention_s)
    return gone


async def _in_batches(step: Callable[[], Awaitable[int]]) -> int:
    gone = 0
    for _ in range(MAX_BATCHES):
        went = await step()
        gone += went
        if went < BATCH:
            break
    return gone
