"""Hand-overs from a worker to its supervisor through Redis, on the real Redis."""

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shared.domain.messages import KillTask, WatchProcess, encode
from shared.host import handovers
from shared.messaging.redis_keys import RedisKeys
from tests.conftest import new_namespace

pytestmark = pytest.mark.integration


@pytest.fixture
async def key(redis: Redis) -> AsyncIterator[str]:
    """A host's hand-over list of a namespace of its own, deleted after the test."""
    name = RedisKeys(new_namespace("handover-", 6)).handovers("h-1")
    yield name
    await redis.delete(name)


def _watch(n: int) -> WatchProcess:
    return WatchProcess(
        job_id="j-1", task_id=f"t-{n}", claim=uuid.uuid4(), pid=1000 + n, create_time=1.5
    )


async def test_hand_overs_are_taken_in_order_and_a_wait_with_none_gives_none(
    redis: Redis, key: str
) -> None:
    for n in range(3):
        await handovers.hand_over(redis, key, _watch(n))
    taken = [await handovers.take(redis, [key], wait_s=1) for _ in range(3)]
    assert [t.task_id if t else None for t in taken] == ["t-0", "t-1", "t-2"]
    assert await handovers.take(redis, [key], wait_s=0.1) is None


async def test_a_list_keeps_its_newest_hand_overs_only(
    redis: Redis, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handovers, "MOST_WAITING", 2)
    for n in range(4):
        await handovers.hand_over(redis, key, _watch(n))
    assert await redis.llen(key) == 2
    assert 0 < await redis.ttl(key) <= handovers.TTL_S
    first = await handovers.take(redis, [key], wait_s=1)
    assert first is not None and first.task_id == "t-2"


async def test_what_is_not_a_hand_over_is_dropped(redis: Redis, key: str) -> None:
    kill = KillTask(
        job_id="j-1", task_id="t-1", claim=uuid.uuid4(), pid=1, create_time=1.0, reason="x"
    )
    await redis.rpush(key, b"not json", encode(kill), encode(_watch(7)))
    assert await handovers.take(redis, [key], wait_s=1) is None
    assert await handovers.take(redis, [key], wait_s=1) is None
    seventh = await handovers.take(redis, [key], wait_s=1)
    assert seventh is not None and seventh.task_id == "t-7"


async def test_a_follower_hands_on_each_hand_over_and_stops_mid_wait(
    redis: Redis, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a supervisor following its host's list, each wait 30 s long
    monkeypatch.setattr(handovers, "WAIT_S", 30)
    followed: asyncio.Queue[WatchProcess] = asyncio.Queue()
    stop = asyncio.Event()
    following = asyncio.create_task(handovers.follow(redis, [key], followed.put_nowait, stop))
    # when its worker hands a command over
    await handovers.hand_over(redis, key, _watch(3))
    # then the supervisor is given it, and a stop cuts its next wait short
    async with asyncio.timeout(5):
        assert (await followed.get()).task_id == "t-3"
    stop.set()
    async with asyncio.timeout(5):
        await following
