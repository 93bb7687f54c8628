"""The store's signer over AMQP: a host asks, the control plane answers (RPC with RabbitMQ's
direct reply-to, `amq.rabbitmq.reply-to`: no queue of the host's own).

Requests go to the signer's queue (`Topology.signer_queue`), which every scheduler replica
consumes: any one answers. The queue is classic and transient, its messages dropped after
`REQUEST_TTL_S` (an asker gives up sooner): a request is worth nothing once its asker stopped
waiting, so nothing of it is kept across a broker's restart or dead-lettered. An asker that
hears nothing within `ANSWER_WITHIN_S` raises `ObjectStoreError` (no signer up, the broker
restarting): the caller retries it as a store that failed.
"""

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from shared.domain.errors import InvalidMessage
from shared.domain.messages import SignOp, SignReply, SignRequest, decode, encode
from shared.messaging.topology import Topology
from shared.objects import ObjectStoreError
from shared.objects.signed import AccessRefused, Signed

logger = logging.getLogger(__name__)

#: How long an asker waits for the signer's answer.
ANSWER_WITHIN_S: Final = 10.0
#: A request not taken by a signer within this long is dropped by the broker.
REQUEST_TTL_S: Final = 10.0
_REPLY_TO: Final = "amq.rabbitmq.reply-to"


async def declare_signer_queue(channel: AbstractChannel, topology: Topology) -> AbstractQueue:
    """Declare the signer's queue (the signer and its askers declare it alike)."""
    return await channel.declare_queue(
        topology.signer_queue,
        durable=False,
        arguments={"x-queue-type": "classic", "x-message-ttl": int(REQUEST_TTL_S * 1000)},
    )


@dataclass
class SignerClient:
    """A host's way to the signer: one channel, its requests, and the answers awaited."""

    connection: AbstractRobustConnection
    topology: Topology
    answer_within_s: float = ANSWER_WITHIN_S
    _channel: AbstractChannel | None = None
    #: The broker's channel underneath that the reply-to consumer is on (a robust channel
    #: gets a new one after a reconnection, without that consumer: it is made again).
    _consuming_on: object = None
    _waiting: dict[str, asyncio.Future[SignReply]] = field(default_factory=dict)
    _opening: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def _open(self) -> AbstractChannel:
        """The channel, opened again if it closed, with its reply-to consumer (made again on
        the channel a reconnection gives it: the pseudo-queue is not one it restores)."""
        async with self._opening:
            if self._channel is None or self._channel.is_closed:
                self._channel = await self.connection.channel(publisher_confirms=False)
                await declare_signer_queue(self._channel, self.topology)
            underlay = await self._channel.get_underlay_channel()
            if underlay is not self._consuming_on:
                replies = await self._channel.get_queue(_REPLY_TO, ensure=False)
                await replies.consume(self._answered, no_ack=True)
                self._consuming_on = underlay
            return self._channel

    async def _answered(self, incoming: AbstractIncomingMessage) -> None:
        waiting = self._waiting.pop(incoming.correlation_id or "", None)
        if waiting is None or waiting.done():
            return  # an answer given up on
        try:
            reply = decode(incoming.body)
        except InvalidMessage as exc:
            waiting.set_exception(ObjectStoreError(f"the store's signer answered nonsense: {exc}"))
            return
        if isinstance(reply, SignReply):
            waiting.set_result(reply)
        else:
            waiting.set_exception(ObjectStoreError(f"the store's signer answered {reply.type}"))

    async def ask(self, request: SignRequest) -> SignReply:
        """The signer's answer to `request`; `ObjectStoreError` if none comes in time."""
        correlation = uuid.uuid4().hex
        waiting: asyncio.Future[SignReply] = asyncio.get_running_loop().create_future()
        self._waiting[correlation] = waiting
        try:
            async with asyncio.timeout(self.answer_within_s):  # a reconnection's wait too
                channel = await self._open()
                await channel.default_exchange.publish(
                    aio_pika.Message(
                        encode(request),
                        content_type="application/json",
                        correlation_id=correlation,
                        reply_to=_REPLY_TO,
                        expiration=REQUEST_TTL_S,
                    ),
                    routing_key=self.topology.signer_queue,
                )
                return await waiting
        except TimeoutError:
            raise ObjectStoreError(
                f"the store's signer did not answer within {self.answer_within_s:.0f} s"
                " (no scheduler running, or the broker restarting)"
            ) from None
        except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            raise ObjectStoreError(f"the store's signer could not be asked: {exc}") from exc
        finally:
            self._waiting.pop(correlation, None)


@dataclass(frozen=True)
class TaskSigning:
    """The `Signing` of one task a host holds: its requests, in its name."""

    client: SignerClient
    host_id: str
    task_id: str
    claim: UUID

    async def __call__(
        self,
        op: SignOp,
        key: str,
        *,
        sha256: str | None = None,
        upload_id: str | None = None,
        first_part: int = 1,
        parts: int = 0,
    ) -> Signed:
        reply = await self.client.ask(
            SignRequest(
                host_id=self.host_id,
                task_id=self.task_id,
                claim=self.claim,
                op=op,
                key=key,
                sha256=sha256,
                upload_id=upload_id,
                first_part=first_part,
                parts=parts,
            )
        )
        if reply.refused is not None:
            raise AccessRefused(f"the store's signer refused to {op} {key}: {reply.refused}")
        return Signed(reply.urls, reply.headers, reply.complete, reply.abort)
