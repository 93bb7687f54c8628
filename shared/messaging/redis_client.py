"""Opening Redis: string replies, bounded timeouts, closed on exit; whether it answers."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from redis.asyncio import BlockingConnectionPool, Redis

from shared.domain.errors import UNAVAILABLE
from shared.runtime.health import Check

logger = logging.getLogger(__name__)

#: A Redis slower than this to answer a ping counts as away (health).
PING_TIMEOUT_S: Final = 1.0
#: The most commands one client has in flight; more wait for one to end (redis-py's own pool
#: raises `MaxConnectionsError` past 100 instead: a burst is no outage).
MAX_CONNECTIONS: Final = 100


@asynccontextmanager
async def open_redis(url: str, *, check: bool = True) -> AsyncIterator[Redis]:
    """A client that decodes replies to str, reconnects by itself after a Redis restart, and
    holds a burst of more than `MAX_CONNECTIONS` commands back rather than failing it.

    With `check` (the default) Redis must answer a ping first; without it the client is handed
    out even while Redis is down, for a service that can do without it for a while.
    """
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=5,
        decode_responses=True,
        socket_timeout=5,
        socket_connect_timeout=5,
        health_check_interval=15,
    )
    client = Redis.from_pool(pool)
    try:
        if check:
            await client.ping()
        yield client
    finally:
        await client.aclose()


async def health(redis: Redis) -> Check:
    """Whether Redis answers a ping within `PING_TIMEOUT_S` (degraded if not)."""
    try:
        async with asyncio.timeout(PING_TIMEOUT_S):
            await redis.ping()
    except (*UNAVAILABLE, TimeoutError) as exc:
        logger.warning("health: Redis does not answer: %s", exc or "timed out")
        return Check(False, "reconnecting to Redis")
    return Check(True, "answers")
