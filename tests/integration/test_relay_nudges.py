"""Workers nudging the relay through Redis (the real Redis): heard by a listening scheduler,
and sent by a worker's writer after its quiet moves."""

import asyncio

import pytest
from redis.asyncio import Redis

from shared.messaging import relay_nudges
from shared.messaging.redis_keys import RedisKeys
from tests.conftest import new_namespace

pytestmark = pytest.mark.integration


async def _subscribed(redis: Redis, channel: str) -> None:
    """Wait until someone listens on `channel` (a publish before that reaches nobody): Redis
    announces no subscription, so this asks."""
    async with asyncio.timeout(5):
        while not (await redis.pubsub_numsub(channel))[0][1]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_nudge_is_heard_by_the_listener_and_the_listener_stops(redis: Redis) -> None:
    # given a scheduler listening for nudges
    channel = RedisKeys(new_namespace("nudge-", 6)).relay_nudges()
    heard, stop = asyncio.Event(), asyncio.Event()
    listening = asyncio.create_task(relay_nudges.listen(redis, channel, heard.set, stop))
    await _subscribed(redis, channel)
    # when a worker nudges
    await relay_nudges.nudge(redis, channel)
    # then the relay is woken, and the listener ends once told to stop
    async with asyncio.timeout(5):
        await heard.wait()
    stop.set()
    async with asyncio.timeout(5):
        await listening
    assert (await redis.pubsub_numsub(channel))[0][1] == 0
