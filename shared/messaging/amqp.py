"""The broker connection: robust reconnects, confirmed persistent publishes, and safe acks.

One `Broker` per service. Publishing uses a channel with publisher confirms and
`on_return_raises=True`, so an unroutable `mandatory` message raises instead of vanishing
(design §10), and every publish has a timeout (a confirm can hang on a dead connection).
"""

import asyncio
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, cast

import aiormq
from aio_pika.abc import (
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from pamqp.commands import Basic

from shared.domain.errors import InvalidMessage
from shared.domain.messages import Message, decode, encode
from shared.domain.messages import _Message as WireMessage
from shared.messaging import frame_batching
from shared.messaging.batch_publish import Outgoing, publish_together
from shared.messaging.nodes import connect_to_a_node, hidden, node_urls
from shared.messaging.topology import Topology, declare_exchanges
from shared.runtime.health import Check
from shared.runtime.ride_out import ride_out

logger = logging.getLogger(__name__)

frame_batching.install()  # what publishes queue together goes out in one socket write

PUBLISH_TIMEOUT_S: Final = 10.0
#: Longest pause between two attempts to reach a broker that is not up yet.
CONNECT_PAUSE_MAX_S: Final = 5.0


@dataclass(frozen=True)
class Publish:
    """One message for `Broker.publish_batch`: what `Broker.publish` takes."""

    exchange: AbstractExchange
    routing_key: str
    body: bytes
    mandatory: bool
    seq: int | None = None


def _headers(seq: int | None) -> dict[str, Any]:
    """An event's position `seq`; none for a work message or a log line."""
    return {} if seq is None else {"seq": seq}


def _properties(seq: int | None) -> Basic.Properties:
    """Persistent JSON; an event's position `seq` in the header `seq` and as its id."""
    if seq is None:
        return Basic.Properties(content_type="application/json", delivery_mode=2)
    return Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        message_id=str(seq),
        headers=_headers(seq),
    )


@dataclass
class Broker:
    """A connection with a confirming publish channel and the two exchanges."""

    connection: AbstractRobustConnection
    channel: AbstractRobustChannel
    events: AbstractExchange
    work: AbstractExchange
    topology: Topology

    async def publish(
        self,
        exchange: AbstractExchange,
        routing_key: str,
        body: bytes,
        *,
        mandatory: bool,
        seq: int | None = None,
    ) -> None:
        """Publish persistent JSON and wait for the broker's confirm (raises on return/timeout).
        `seq`, an event's position, goes in the header `seq` and as the `message_id` too.

        Straight to the channel underneath (the properties aio-pika's `Message` would make,
        without the cost of making one: the relay publishes a dozen a task), without waiting
        for the socket to drain (`wait=False`: what waits is the confirm), so that publishes
        made together are written together (`frame_batching`)."""
        channel = await self._publishing_channel()
        await channel.basic_publish(
            body,
            exchange=exchange.name,
            routing_key=routing_key,
            properties=_properties(seq),
            mandatory=mandatory,
            timeout=PUBLISH_TIMEOUT_S,
            wait=False,
        )

    async def publish_batch(self, messages: Sequence[Publish]) -> list[BaseException | None]:
        """Publish `messages` in order, as `publish` would each, in one step
        (`batch_publish.publish_together`: one lock, one queued frame, the confirms waited
        for together); what became of each, in order (None: confirmed)."""
        channel = await self._publishing_channel()
        return await publish_together(
            channel,
            [
                Outgoing(
                    m.exchange.name,
                    m.routing_key,
                    m.body,
                    m.mandatory,
                    None if m.seq is None else str(m.seq),
                    _headers(m.seq),
                )
                for m in messages
            ],
            PUBLISH_TIMEOUT_S,
        )

    async def _publishing_channel(self) -> aiormq.Channel:
        if self.channel.is_closed:  # the channel both exchanges were declared on
            raise aiormq.exceptions.ChannelInvalidStateError(f"{self.channel!r} closed")
        # aiormq's channel: its abstract type does not declare `wait`
        return cast(aiormq.Channel, await self.channel.get_underlay_channel())

    async def publish_event(self, routing_key: str, message: WireMessage) -> None:
        """Publish an event; an event no one listens to is dropped by the broker, as intended."""
        await self.publish(self.events, routing_key, encode(message), mandatory=False)

    async def publish_work(self, routing_key: str, message: WireMessage) -> None:
        """Publish a work message that must reach a queue (raises if unroutable)."""
        await self.publish(self.work, routing_key, encode(message), mandatory=True)

    def health(self) -> Check:
        """Whether the connection is up now (lost, it is made again by itself, on the next node
        of a cluster): the robust connection's own state, no round trip."""
        if self.connection.connected.is_set():
            return Check(True, f"connected to {self.connection}")
        return Check(False, f"reconnecting to RabbitMQ ({self.connection})")

    async def channel_for_consuming(self, prefetch: int) -> AbstractRobustChannel:
        """A new channel for a consumer, with `prefetch` unacked deliveries at most."""
        channel = await self.connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch)
        return channel


async def connect(
    url: str, name: str, give_up_after_s: float | None = None
) -> AbstractRobustConnection:
    """A robust connection to a node of `url` (one or several, `shared.messaging.nodes`),
    waiting for the broker if it is not up yet (a service started while RabbitMQ restarts
    waits for it, instead of dying; each attempt tries the next node); raises
    `AMQPConnectionError` once `give_up_after_s` have passed (None: never gives up)."""
    loop = asyncio.get_running_loop()
    deadline = None if give_up_after_s is None else loop.time() + give_up_after_s
    pause = 0.2
    urls = node_urls(url)
    nodes = len(urls)
    first = random.randrange(nodes)  # a cluster's clients spread over its nodes
    for attempt in itertools.count(first):
        try:
            return await connect_to_a_node(url, name, 10, first=attempt)
        except (aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError) as exc:
            node = hidden(urls[attempt % nodes])
            if deadline is not None and loop.time() + pause > deadline:
                raise aiormq.exceptions.AMQPConnectionError(
                    f"RabbitMQ at {node} did not answer: {exc}"
                ) from exc
            logger.warning("waiting for RabbitMQ (%s): %s", node, exc)
            if (attempt + 1 - first) % nodes == 0:  # every node tried once: pause
                await asyncio.sleep(pause)
                pause = min(pause * 2, CONNECT_PAUSE_MAX_S)
    raise AssertionError("unreachable")


@asynccontextmanager
async def open_broker(
    url: str, topology: Topology, name: str, give_up_after_s: float | None = None
) -> AsyncIterator[Broker]:
    """Connect (waiting for the broker, reconnecting by itself afterwards), declare the
    exchanges, close on exit."""
    connection = await connect(url, name, give_up_after_s)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        events, work = await declare_exchanges(channel, topology)
        yield Broker(connection, channel, events, work, topology)
    finally:
        await connection.close()


Handler = Callable[[Message], Awaitable[None]]


async def deliver(incoming: AbstractIncomingMessage, handler: Handler) -> None:
    """Decode, handle, then ack. Undecodable → dead-lettered; a handler error → requeued.

    Requeued deliveries count towards the queue's delivery limit, after which the broker
    dead-letters them, so a poison message cannot loop forever. Handlers must be idempotent.
    A handler that meets a lost database connection (a restart) is made again once it is back
    (`shared.runtime.ride_out`), not requeued: a redelivery would fail the same way at once and
    spend the delivery limit, and a dead-lettered kill order is a kill never done.
    """
    try:
        message = decode(incoming.body)
    except InvalidMessage as exc:
        logger.error("dead-lettering an undecodable message: %s", exc)
        await settle(incoming, ack=False, requeue=False)
        return
    try:
        await ride_out(lambda: handler(message), f"handling {message.type}")
    except Exception:
        logger.exception("handler failed; the message goes back to its queue")
        await settle(incoming, ack=False, requeue=True)
        raise
    await settle(incoming, ack=True)


async def settle(incoming: AbstractIncomingMessage, *, ack: bool, requeue: bool = False) -> None:
    """Ack or reject, ignoring a channel that died meanwhile (the broker will redeliver)."""
    try:
        if ack:
            await incoming.ack()
        else:
            await incoming.reject(requeue=requeue)
    except (aiormq.exceptions.AMQPError, RuntimeError) as exc:
        logger.warning("could not settle a delivery (its channel is gone): %s", exc)
