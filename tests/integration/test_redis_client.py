"""A service's Redis client (`shared/messaging/redis_client.py`) on the real Redis: a burst of
more commands than it keeps connections waits for one, rather than failing."""

import asyncio

import pytest

from shared.messaging.redis_client import MAX_CONNECTIONS, open_redis
from shared.messaging.redis_keys import RedisKeys

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


async def test_a_burst_of_more_commands_than_connections_all_succeed(namespace: str) -> None:
    key = RedisKeys(namespace).job_progress("burst")
    async with open_redis(REDIS_URL) as redis:
        try:
            # BLPOP holds its connection until it times out: the burst outlives the pool
            waits = [redis.blpop([key + ":nothing"], timeout=0.2) for _ in range(MAX_CONNECTIONS)]
            counts = [redis.hincrby(key, "n", 1) for _ in range(2 * MAX_CONNECTIONS)]
            await asyncio.gather(*waits, *counts)
            assert await redis.hget(key, "n") == str(2 * MAX_CONNECTIONS)
        finally:
            await redis.delete(key)
