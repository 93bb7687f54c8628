"""Leadership: one active scheduler per database, standbys wait on a PostgreSQL advisory lock.

The lock lives as long as its session: if the connection drops (a database restart), the
leader stops leading until it holds the lock again.
"""

import asyncio
import logging
from typing import Final

import asyncpg

from shared.domain.errors import UNAVAILABLE
from shared.runtime.lifecycle import wait_or_stop
from shared.store.db import SCHEDULER_LOCK_KEY

logger = logging.getLogger(__name__)

_RETRY_S: Final = 1.0


class Leadership:
    """Holds (or waits for) the scheduler's advisory lock on a dedicated connection."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this process leads (True) or `stop` is set (False)."""
        announced = False
        while not stop.is_set():
            try:
                if await self._try():
                    logger.info("leading")
                    return True
            except UNAVAILABLE as exc:
                logger.warning("cannot reach the database for leadership: %s", exc)
            if not announced:
                logger.info("another scheduler leads; standing by")
                announced = True
            await wait_or_stop(stop, _RETRY_S)
        return False

    async def _try(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn)
        if await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", SCHEDULER_LOCK_KEY):
            return True
        await self._conn.close()
        self._conn = None
        return False

    async def release(self) -> None:
        """Give up the lock (closing its session)."""
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
        self._conn = None
