"""The declared topology on the real RabbitMQ: quorum work queues, dead-lettering, routing.

Each test works in a namespace of its own and deletes every queue and exchange it declared.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from shared.domain.messages import RunStage, WatchProcess, decode
from shared.domain.states import Stage
from shared.messaging.amqp import Broker, connect, open_broker
from shared.messaging.topology import (
    DELIVERY_LIMIT,
    Topology,
    declare_all_work_queues,
    delete_all,
    host_key,
    pool_key,
    supervise_key,
)
from tests.conftest import AMQP_URL, require_servers

pytestmark = pytest.mark.integration

HOST = "h-1"


@pytest.fixture
async def broker(namespace: str) -> AsyncIterator[Broker]:
    """A broker on this test's namespace; every name the namespace declared is deleted after."""
    require_servers()
    topology = Topology(namespace)
    async with open_broker(AMQP_URL, topology, name=f"test-topology-{namespace}") as opened:
        try:
            yield opened
        finally:
            # A fresh channel: the test may have closed the publishing one.
            cleanup = await opened.connection.channel()
            await delete_all(cleanup, topology, [HOST])
            await cleanup.close()


async def _consuming(broker: Broker, name: str) -> tuple[AbstractChannel, AbstractQueue]:
    channel = await broker.channel_for_consuming(prefetch=1)
    return channel, await channel.declare_queue(name, passive=True)


async def _receive(queue: AbstractQueue) -> AbstractIncomingMessage:
    """The next delivery of `queue` (unsettled), waiting at most 5 s."""
    async with asyncio.timeout(5), queue.iterator() as messages:
        async for message in messages:
            return message
    raise AssertionError(f"the consumer of {queue.name} stopped without a message")


def _work() -> RunStage:
    return RunStage(job_id="j-1", task_id="t-1", stage=Stage.CLUSTER, claim=uuid.uuid4())


async def test_when_work_is_published_to_a_host__its_host_queue_delivers_it_persistent(
    broker: Broker,
) -> None:
    # given
    await declare_all_work_queues(broker.channel, broker.topology, HOST)
    sent = _work()
    # when
    await broker.publish_work(host_key(HOST), sent)
    # then
    channel, queue = await _consuming(broker, broker.topology.host_queue(HOST))
    received = await _receive(queue)
    assert decode(received.body) == sent
    assert received.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert received.content_type == "application/json"
    await received.ack()
    await channel.close()


async def test_when_work_goes_to_the_pool_and_supervisor_keys__each_queue_gets_its_own(
    broker: Broker,
) -> None:
    await declare_all_work_queues(broker.channel, broker.topology, HOST)
    for_pool = _work()
    for_supervisor = WatchProcess(
        job_id="j-1", task_id="t-1", claim=uuid.uuid4(), pid=4242, create_time=1.5
    )
    await broker.publish_work(pool_key(), for_pool)
    await broker.publish_work(supervise_key(HOST), for_supervisor)
    channel = await broker.channel_for_consuming(prefetch=1)
    pool_queue = await channel.declare_queue(broker.topology.pool_queue(), passive=True)
    supervisor_queue = await channel.declare_queue(
        broker.topology.supervisor_queue(HOST), passive=True
    )
    host_queue = await channel.declare_queue(broker.topology.host_queue(HOST), passive=True)
    from_pool = await _receive(pool_queue)
    await from_pool.ack()
    from_supervisor = await _receive(supervisor_queue)
    await from_supervisor.ack()
    assert decode(from_pool.body) == for_pool
    assert decode(from_supervisor.body) == for_supervisor
    assert await host_queue.get(fail=False) is None
    await channel.close()


async def test_when_a_work_message_is_requeued__it_comes_back_counted_as_on_a_quorum_queue(
    broker: Broker,
) -> None:
    # Only quorum queues stamp redeliveries with x-delivery-count.
    await declare_all_work_queues(broker.channel, broker.topology, HOST)
    await broker.publish_work(host_key(HOST), _work())
    channel, queue = await _consuming(broker, broker.topology.host_queue(HOST))
    first = await _receive(queue)
    await first.reject(requeue=True)
    again = await _receive(queue)
    assert again.redelivered
    assert again.headers.get("x-delivery-count") == 1
    await again.ack()
    await channel.close()


async def test_when_a_work_message_is_rejected_without_requeue__it_lands_in_the_dlq(
    broker: Broker,
) -> None:
    # given
    await declare_all_work_queues(broker.channel, broker.topology, HOST)
    sent = _work()
    await broker.publish_work(host_key(HOST), sent)
    channel, queue = await _consuming(broker, broker.topology.host_queue(HOST))
    _dlq_channel, dlq = await _consuming(broker, broker.topology.dead_letter_queue)
    # when
    await (await _receive(queue)).reject(requeue=False)
    # then
    dead = await _receive(dlq)
    assert decode(dead.body) == sent
    await dead.ack()
    assert await queue.get(fail=False) is None
    await channel.close()


async def test_when_a_poison_message_keeps_being_requeued__it_is_dead_lettered_at_the_limit(
    broker: Broker,
) -> None:
    # given
    await declare_all_work_queues(broker.channel, broker.topology, HOST)
    sent = _work()
    await broker.publish_work(host_key(HOST), sent)
    channel, queue = await _consuming(broker, broker.topology.host_queue(HOST))
    _dlq_channel, dlq = await _consuming(broker, broker.topology.dead_letter_queue)
    # when: the first delivery and DELIVERY_LIMIT redeliveries are all handed back
    for _ in range(DELIVERY_LIMIT + 1):
        await (await _receive(queue)).reject(requeue=True)
    # then
    dead = await _receive(dlq)
    assert decode(dead.body) == sent
    await dead.ack()
    assert await queue.get(fail=False) is None
    await channel.close()


async def test_when_the_topology_is_declared_twice__nothing_changes_and_messages_stay(
    broker: Broker,
) -> None:
    # given
    first = await declare_all_work_queues(broker.channel, broker.topology, HOST)
    sent = _work()
    await broker.publish_work(host_key(HOST), sent)
    # when: again on the same channel, and from another connection as another service would
    second = await declare_all_work_queues(broker.channel, broker.topology, HOST)
    async with open_broker(AMQP_URL, broker.topology, name="test-topology-second") as other:
        await declare_all_work_queues(other.channel, other.topology, HOST)
    # then
    assert [q.name for q in first] == [q.name for q in second]
    assert not broker.channel.is_closed
    await broker.publish_work(host_key(HOST), _work())  # the channel still publishes
    channel, queue = await _consuming(broker, broker.topology.host_queue(HOST))
    received = await _receive(queue)
    assert decode(received.body) == sent
    await received.ack()
    await channel.close()


async def test_when_work_has_no_queue_to_go_to__publish_work_raises(broker: Broker) -> None:
    # given
    await declare_all_work_queues(broker.channel, broker.topology, HOST)
    # when / then
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await broker.publish_work(host_key("h-nobody"), _work())
    await broker.publish_work(host_key(HOST), _work())  # the channel survived the return


async def test_when_an_event_has_no_listener__publish_event_drops_it_without_error(
    broker: Broker,
) -> None:
    await broker.publish_event("task.new.j-1", _work())


async def test_when_the_broker_does_not_answer__connecting_waits_then_gives_up_clearly() -> None:
    with pytest.raises(aiormq.exceptions.AMQPConnectionError, match=r"guest:\*\*\*@") as caught:
        await connect("amqp://guest:secret@127.0.0.1:1/", "test", give_up_after_s=1.0)
    assert "secret" not in str(caught.value)
