"""Waiting for a PostgreSQL backend to block on a lock (a helper for race tests; no tests).

PostgreSQL announces nothing when a backend starts waiting, so this polls `pg_stat_activity`.
"""

import asyncio

from shared.store.db import Pool

_WAITING = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"


async def until_blocked(pool: Pool, backend_pid: int, within: float = 10.0) -> None:
    """Return once backend `backend_pid` waits for a lock; TimeoutError after `within` s."""
    async with asyncio.timeout(within), pool.acquire() as observer:
        while await observer.fetchval(_WAITING, backend_pid) != "Lock":  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def until_someone_blocked(pool: Pool, within: float = 10.0, running: str = "%") -> None:
    """Return once any backend of this database waits for a lock (when the waiter's backend
    is not known, e.g. a connection of the code under test's own pool); `running`: only one
    whose statement is `LIKE` it."""
    query = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE $1"
    )
    async with asyncio.timeout(within), pool.acquire() as observer:
        while not await observer.fetchval(query, running):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
