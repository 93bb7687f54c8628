"""Live event streams: one broker connection per api process, one channel per stream.

`EventHub.subscribe()` gives a `Subscription`: an exclusive, auto-deleted classic queue bound to
checked topic patterns on the events exchange, consumed with manual acks and a small prefetch
(a slow client slows its own queue, which is bounded, and nothing else). The connection is
opened on the first subscription and reconnects by itself (robust); the hub holds a strong
reference to every live subscription (aio-pika restores only objects still referenced,
design §10) and closes them all when the api stops.
"""

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from typing import Any, Final, Literal

import aiormq
from aio_pika.abc import (
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
)

from shared.domain.errors import UNAVAILABLE
from shared.messaging.amqp import settle
from shared.messaging.nodes import connect_to_a_node
from shared.messaging.topology import Topology, declare_events_exchange, declare_follower_queue

logger = logging.getLogger(__name__)

#: Deliveries a stream may hold unacknowledged (acked once written to the client).
PREFETCH: Final = 64
#: Longest wait for the broker while opening a stream.
OPEN_TIMEOUT_S: Final = 10.0

_BROKER_ERRORS: Final = (*UNAVAILABLE, aiormq.exceptions.AMQPError, TimeoutError)


#: What `Subscription.next()` gives, instead of a message, when the stream's link to the broker
#: was lost or has just been restored: deliveries may be missing, read the history now.
WAKE: Final = "wake"

Delivery = AbstractIncomingMessage | Literal["wake"]


class StreamsUnavailable(Exception):
    """No stream can be opened now: the broker does not answer, or the api has too many."""


class TooManyStreams(StreamsUnavailable):
    """The caller holds their share of this api's streams already."""


class Subscription:
    """One stream's queue; `next()` gives its messages in order, None once closed.

    While the broker is away nothing is delivered, and an event published before the robust
    channel restores the queue (with its bindings and consumer) never reaches it: `lost` says
    so, and `next()` gives `WAKE` when the channel closes and again once it is restored, so
    that the stream reads what it missed from the history at once.
    """

    def __init__(self, channel: AbstractRobustChannel, queue: AbstractQueue) -> None:
        self.channel = channel
        self.queue = queue
        self._inbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._closed = False
        self._tag: str | None = None
        #: Whether the channel is closed, waiting to be restored (deliveries may be missing).
        self.lost = False
        channel.close_callbacks.add(self._on_lost)
        channel.reopen_callbacks.add(self._on_restored)

    def _on_lost(self, *_: Any) -> None:
        if not self._closed:
            self.lost = True
            self._inbox.put_nowait(WAKE)

    def _on_restored(self, *_: Any) -> None:
        if not self._closed:
            self.lost = False
            self._inbox.put_nowait(WAKE)

    @property
    def name(self) -> str:
        """The queue's name (for logs and tests)."""
        return self.queue.name

    async def start(self) -> None:
        """Start consuming; messages wait in the inbox until `next()` takes them."""
        self._tag = await self.queue.consume(self._inbox.put, no_ack=False)

    async def next(self) -> Delivery | None:
        """The next message (ack it with `ack()` once delivered) or `WAKE`, None when closed."""
        if self._closed:
            return None
        return await self._inbox.get()

    def next_nowait(self) -> Delivery | None:
        """The next message or `WAKE` if one is waiting; None when none is, or once closed."""
        if self._closed:
            return None
        try:
            return self._inbox.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def ack(self, delivery: Delivery) -> None:
        """Acknowledge a delivered message (ignored if its channel is gone, and for `WAKE`)."""
        if not isinstance(delivery, str):
            await settle(delivery, ack=True)

    async def close(self) -> None:
        """Delete the queue and close the channel; idempotent, never raises broker errors."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put_nowait(None)
        # Deleted explicitly: auto-delete would also do it when the channel closes, but not
        # while a reconnecting robust channel is about to re-declare it.
        await _quietly(self._delete(), f"delete event queue {self.name}")
        await _quietly(self.channel.close(), f"close the channel of {self.name}")

    async def _delete(self) -> None:
        async with asyncio.timeout(OPEN_TIMEOUT_S):
            if self._tag is not None:
                await self.queue.cancel(self._tag)
            await self.queue.delete(if_unused=False, if_empty=False)


class EventHub:
    """The api process's follower side of the events exchange."""

    def __init__(
        self, amqp_url: str, topology: Topology, max_streams: int, per_holder: int | None = None
    ) -> None:
        self._url = amqp_url
        self._topology = topology
        self._max_streams = max_streams
        self._per_holder = per_holder
        self._holders: dict[Subscription, str] = {}  # who opened each stream that counts
        self._connection: AbstractRobustConnection | None = None
        self._lock = asyncio.Lock()
        self._live: set[Subscription] = set()
        self._closers: dict[Subscription, asyncio.Task[None]] = {}  # strong refs while closing
        self._idle = asyncio.Event()  # set while no stream is open
        self._idle.set()
        self._closing = False
        #: Connections opened so far (one per process, unless the first attempt failed).
        self.connects = 0
        self._attempts = 0  # each attempt to connect goes to the next node of a cluster

    def queue_names(self) -> list[str]:
        """The queues of the streams open now."""
        return sorted(s.name for s in self._live)

    async def wait_idle(self) -> None:
        """Return once no stream is open (at once if none is)."""
        await self._idle.wait()

    async def subscribe(self, patterns: list[str], holder: str | None = None) -> Subscription:
        """A consuming subscription bound to every checked pattern in `patterns`.

        When this returns, the bindings exist: every event published from now on reaches it.
        Raises `StreamsUnavailable` when the broker does not answer or the api is at its limit,
        `TooManyStreams` when `holder` (a user; None: not counted) holds their share already.
        """
        if self._closing:
            raise StreamsUnavailable("the api is shutting down")
        if len(self._live) >= self._max_streams:
            raise StreamsUnavailable(f"this api serves {self._max_streams} event streams already")
        if holder is not None and self._per_holder is not None:
            held = sum(1 for h in self._holders.values() if h == holder)
            if held >= self._per_holder:
                raise TooManyStreams(
                    f"you hold {held} event streams of this api already (at most"
                    f" {self._per_holder}); close one, or follow several topics in one stream"
                )
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                connection = await self._connect()
                channel = await connection.channel(publisher_confirms=False)
        except _BROKER_ERRORS as exc:
            logger.warning("cannot open an event stream: %s", exc)
            raise StreamsUnavailable("the message broker does not answer; retry later") from exc
        assert isinstance(channel, AbstractRobustChannel)  # channels of a robust connection
        name = self._topology.follower_queue(uuid.uuid4().hex[:16])
        subscription: Subscription | None = None
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                await channel.set_qos(prefetch_count=PREFETCH)
                queue = await declare_follower_queue(channel, self._topology, name, patterns)
                subscription = Subscription(channel, queue)
                self._live.add(subscription)
                if holder is not None:
                    self._holders[subscription] = holder
                self._idle.clear()
                await subscription.start()
        except _BROKER_ERRORS as exc:
            if subscription is not None:
                await self.release(subscription)
            else:
                await _close_quietly(channel)
            logger.warning("cannot open an event stream: %s", exc)
            raise StreamsUnavailable("the message broker does not answer; retry later") from exc
        logger.debug("event stream %s follows %s", name, patterns)
        return subscription

    async def release(self, subscription: Subscription) -> None:
        """Close a subscription and forget it (idempotent).

        The closing runs in a task of its own, so a caller cancelled meanwhile (a request whose
        client went away) cannot leave the queue and its channel behind.
        """
        closer = self._closers.get(subscription)
        if closer is None:
            if subscription not in self._live:
                return
            closer = asyncio.create_task(
                self._close(subscription), name=f"close-{subscription.name}"
            )
            self._closers[subscription] = closer
        await asyncio.shield(closer)

    async def _close(self, subscription: Subscription) -> None:
        try:
            await subscription.close()
        finally:
            self._live.discard(subscription)
            self._holders.pop(subscription, None)
            del self._closers[subscription]
            if not self._live:
                self._idle.set()

    async def queue_depths(self, names: list[str]) -> dict[str, int]:
        """Messages ready in each named queue that exists (a passive declare each, for
        `/metrics`); a queue that does not exist is left out. Raises when the broker does not
        answer."""
        connection = await self._connect()
        depths: dict[str, int] = {}
        for name in names:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                depths[name] = int(queue.declaration_result.message_count or 0)
            except aiormq.exceptions.ChannelNotFoundEntity:
                continue  # the channel is closed by the broker with it
            finally:
                await _close_quietly(channel)
        return depths

    async def close(self) -> None:
        """End every stream and close the connection (the api is stopping)."""
        self._closing = True
        await asyncio.gather(*(self.release(s) for s in list(self._live)))
        async with self._lock:
            if self._connection is not None:
                await _quietly(self._connection.close(), "close the broker connection")
                self._connection = None

    async def _connect(self) -> AbstractRobustConnection:
        async with self._lock:
            if self._connection is None:
                self._attempts += 1
                connection = await connect_to_a_node(
                    self._url, "api-events", OPEN_TIMEOUT_S, first=self._attempts - 1
                )
                try:
                    channel = await connection.channel()
                    await declare_events_exchange(channel, self._topology)
                    await channel.close()
                except _BROKER_ERRORS:
                    await _close_quietly(connection)
                    raise
                self._connection = connection
                self.connects += 1
                logger.info("connected to the broker for event streams")
            return self._connection


async def _close_quietly(closable: AbstractRobustChannel | AbstractRobustConnection) -> None:
    await _quietly(closable.close(), "close")


async def _quietly(step: Awaitable[object], what: str) -> None:
    """Await a broker call during a close; its failure is logged, never raised.

    aiormq reports a call cut short by its channel closing as `CancelledError`: that one is
    swallowed too, unless this task itself is being cancelled.
    """
    try:
        await step
    except (*_BROKER_ERRORS, RuntimeError) as exc:
        logger.warning("could not %s: %s", what, exc)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        logger.warning("could not %s: the broker call was cancelled", what)
