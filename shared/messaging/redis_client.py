"""Opening Redis: string replies, bounded timeouts, closed on exit."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio import Redis


@asynccontextmanager
async def open_redis(url: str, *, check: bool = True) -> AsyncIterator[Redis]:
    """A client that decodes replies to str and reconnects by itself after a Redis restart.

    With `check` (the default) Redis must answer a ping first; without it the client is handed
    out even while Redis is down, for a service that can do without it for a while.
    """
    client = Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=5,
        socket_connect_timeout=5,
        health_check_interval=15,
    )
    try:
        if check:
            await client.ping()
        yield client
    finally:
        await client.aclose()
