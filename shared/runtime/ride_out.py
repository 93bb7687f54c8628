"""Riding out a database that went away for a while (a restart, a failover): work made again
while its error says the connection was lost, for a bounded time."""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from shared.domain.errors import connection_lost

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: How long work waits for a database that went away (a restart, a failover) before giving up,
#: and the longest pause between two tries.
RIDE_OUT_S: Final = 120.0
RIDE_OUT_PAUSE_S: Final = 1.0


async def ride_out(call: Callable[[], Awaitable[T]], what: str) -> T:
    """`call()`, made again while its error says the database connection went away, with
    pauses growing to `RIDE_OUT_PAUSE_S`, for up to `RIDE_OUT_S`; any other error, or the
    same one past it, is raised. `call` must be safe to make again (idempotent)."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + RIDE_OUT_S, 0.1
    while True:
        try:
            return await call()
        except Exception as exc:
            if not connection_lost(exc) or loop.time() > deadline:
                raise
            logger.warning("database away while %s: %s", what, exc)
        await asyncio.sleep(pause)
        pause = min(pause * 2, RIDE_OUT_PAUSE_S)
