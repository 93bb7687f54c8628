"""A connection to a cluster's nodes (`shared.messaging.nodes`) on the real RabbitMQ: it goes to
a node that answers, and when its node goes away it is made again on the next one.

The "nodes" here are the one real broker, reached directly and through a link the test can cut
(`tests.e2e.links`): the connection cannot tell them apart, which is what matters.
"""

import asyncio
import random

import pytest
from yarl import URL

from bench.cluster import free_port
from shared.messaging.amqp import connect, open_broker
from shared.messaging.topology import Topology
from tests.conftest import AMQP_URL, require_servers
from tests.e2e.links import Link

pytestmark = pytest.mark.integration


async def test_a_node_that_does_not_answer_is_passed_over() -> None:
    require_servers()
    down = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    connection = await connect(f"{down},{AMQP_URL}", "test-nodes-down", give_up_after_s=20)
    try:
        assert connection.connected.is_set()
        assert URL(str(connection)).port == URL(AMQP_URL).port
    finally:
        await connection.close()


async def test_a_connection_whose_node_goes_is_made_again_on_the_next(
    broker_link: Link, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut the first node's link under a live broker: the connection is made again on the
    other node, the channel with it, and a publish there is confirmed and consumed."""
    monkeypatch.setattr(random, "randrange", lambda _: 0)  # the first node first
    through_link = broker_link.urls["amqp"]
    topology = Topology(namespace)
    async with open_broker(f"{through_link},{AMQP_URL}", topology, "test-nodes") as broker:
        assert URL(str(broker.connection)).port == URL(through_link).port
        reconnected = asyncio.Event()
        broker.connection.reconnect_callbacks.add(lambda *_: reconnected.set())
        consumer = await broker.channel_for_consuming(prefetch=1)
        queue = await consumer.declare_queue(f"{namespace}.nodes", exclusive=True)
        await queue.bind(broker.events, routing_key="log.info.#")

        broker_link.cut()
        async with asyncio.timeout(15):
            await reconnected.wait()
        assert URL(str(broker.connection)).port == URL(AMQP_URL).port
        assert not broker.channel.is_closed  # channels are restored before the callbacks run

        await broker.publish(broker.events, "log.info.job-1", b"{}", mandatory=False)
        async with asyncio.timeout(10), queue.iterator(no_ack=True) as delivered:
            message = await anext(delivered)
        assert message.routing_key == "log.info.job-1"
        await broker.events.delete()
        await broker.work.delete()
