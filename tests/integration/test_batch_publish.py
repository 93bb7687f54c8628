"""A batch published in one step on the real RabbitMQ (`shared/messaging/batch_publish.py`):
each message confirmed on its own, in order, with its properties; a returned one fails alone;
the channel's delivery tags stay in step with single publishes made beside it."""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import aio_pika
import aiormq
import pytest

from shared.messaging.amqp import Broker, Publish, open_broker
from shared.messaging.topology import Topology
from tests.conftest import AMQP_URL, new_namespace

pytestmark = pytest.mark.integration


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with open_broker(AMQP_URL, Topology(new_namespace("batch-", 8)), name="t") as opened:
        yield opened


async def _queue(broker: Broker, key: str) -> aio_pika.abc.AbstractQueue:
    queue = await broker.channel.declare_queue(f"q-{uuid.uuid4().hex[:8]}", exclusive=True)
    await queue.bind(broker.events, key)
    return queue


async def _receive(queue: aio_pika.abc.AbstractQueue, count: int) -> list[Any]:
    received: list[Any] = []
    async with asyncio.timeout(10), queue.iterator(no_ack=True) as messages:
        async for message in messages:
            received.append(message)
            if len(received) == count:
                break
    return received


async def test_each_message_of_a_batch_is_confirmed_and_arrives_in_order_with_its_position(
    broker: Broker,
) -> None:
    # given a queue bound to one job's events
    key = f"task.new.j-{uuid.uuid4().hex[:8]}"
    queue = await _queue(broker, key)
    # when 300 events are published as one batch, each with its position
    batch = [
        Publish(broker.events, key, json.dumps({"n": n}).encode(), False, 1000 + n)
        for n in range(300)
    ]
    outcomes = await broker.publish_batch(batch)
    # then each was confirmed, and they arrive once each, in order, as `publish` sends them
    assert outcomes == [None] * 300
    messages = await _receive(queue, 300)
    assert [json.loads(m.body)["n"] for m in messages] == list(range(300))
    assert [m.message_id for m in messages] == [str(1000 + n) for n in range(300)]
    assert [m.headers["seq"] for m in messages] == [1000 + n for n in range(300)]
    assert {(m.content_type, m.delivery_mode) for m in messages} == {
        ("application/json", aio_pika.DeliveryMode.PERSISTENT)
    }


async def test_work_messages_written_by_hand_arrive_whole_persistent_and_each_with_its_id(
    broker: Broker,
) -> None:
    # given a queue bound to a host's work key
    key = f"host.h-{uuid.uuid4().hex[:8]}"
    queue = await broker.channel.declare_queue(f"q-{uuid.uuid4().hex[:8]}", exclusive=True)
    await queue.bind(broker.work, key)
    # when work messages (no position: `plain_frames`) go out in a batch with an event, one
    # of them longer than a frame
    big = json.dumps({"n": 1, "pad": "x" * 300_000}).encode()
    batch = [
        Publish(broker.work, key, b'{"n": 0}', True),
        Publish(broker.events, f"task.new.j-{uuid.uuid4().hex[:8]}", b"{}", False, 7),
        Publish(broker.work, key, big, True),
        Publish(broker.work, key, b'{"n": 2}', True),
    ]
    outcomes = await broker.publish_batch(batch)
    # then each is confirmed, and arrives whole, in order, as persistent JSON with an id
    assert outcomes == [None] * 4
    messages = await _receive(queue, 3)
    assert [json.loads(m.body)["n"] for m in messages] == [0, 1, 2]
    assert messages[1].body == big
    assert {(m.content_type, m.delivery_mode) for m in messages} == {
        ("application/json", aio_pika.DeliveryMode.PERSISTENT)
    }
    assert len({m.message_id for m in messages}) == 3
    assert all(m.message_id and not m.headers for m in messages)


async def test_a_returned_work_message_fails_alone_and_the_channel_goes_on(
    broker: Broker,
) -> None:
    # given a queue for events, and a work message no queue would take between two events
    key = f"task.new.j-{uuid.uuid4().hex[:8]}"
    queue = await _queue(broker, key)
    batch = [
        Publish(broker.events, key, b'{"n": 0}', False, 1),
        Publish(broker.work, f"host.nowhere-{uuid.uuid4().hex[:8]}", b"{}", True),
        Publish(broker.events, key, b'{"n": 1}', False, 2),
    ]
    # when the batch is published
    first, returned, last = await broker.publish_batch(batch)
    # then only the unroutable one failed, as `publish` would have raised for it
    assert (first, last) == (None, None)
    assert isinstance(returned, aiormq.exceptions.PublishError)
    # and single publishes and batches made together after it are still each confirmed
    results = await asyncio.gather(
        broker.publish(broker.events, key, b'{"n": 2}', mandatory=False),
        broker.publish_batch([Publish(broker.events, key, b'{"n": 3}', False, 3)]),
        broker.publish(broker.events, key, b'{"n": 4}', mandatory=False),
    )
    assert list(results) == [None, [None], None]
    bodies = sorted(json.loads(m.body)["n"] for m in await _receive(queue, 5))
    assert bodies == [0, 1, 2, 3, 4]


async def test_a_batch_with_a_message_that_cannot_be_written_is_refused_whole(
    broker: Broker,
) -> None:
    key = f"task.new.j-{uuid.uuid4().hex[:8]}"
    queue = await _queue(broker, key)
    # when a batch whose second message's key is 131 characters but 257 bytes is published
    with pytest.raises(ValueError, match="too long"):
        await broker.publish_batch(
            [
                Publish(broker.events, key, b'{"n": 0}', False, 1),
                Publish(broker.work, "host." + "é" * 126, b"{}", True),
            ]
        )
    # then none of it was sent, and no confirm waits for it
    channel = cast(aiormq.Channel, await broker.channel.get_underlay_channel())
    assert not channel.confirmations
    # and the channel goes on, its tags in step: the next batch is confirmed and arrives alone
    assert await broker.publish_batch([Publish(broker.events, key, b'{"n": 1}', False, 2)]) == [
        None
    ]
    assert [json.loads(m.body)["n"] for m in await _receive(queue, 1)] == [1]


async def test_a_batch_on_a_closed_channel_is_refused_whole(broker: Broker) -> None:
    # given the publishing channel closed
    await broker.channel.close()
    # when a batch is published, then none of it is sent: the call raises
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        await broker.publish_batch([Publish(broker.events, "task.new.j-closed", b"{}", False)])


async def test_an_empty_batch_sends_nothing(broker: Broker) -> None:
    assert await broker.publish_batch([]) == []
