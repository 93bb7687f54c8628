"""The store's signer: the control plane holds the S3 store's credentials, and signs for a
host the link of one request on one object at a time, after the database says the host may
make it (`shared/operations/grants.py`): a write of an output key of a task it holds, while
it post-processes that attempt; a read of an object that task names. Hosts hold no
credential (docs/explanation/storage.md, "Who holds what").

Every scheduler replica answers the signer's queue (`shared/messaging/signing.py`), leader or
not: any one may. A refusal is an answer (`SignReply.refused`, why), never silence. Links
last `VIGIL_SIGNED_LINK_S`. A directory store needs no signer: hosts write it themselves.
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from shared.domain.errors import UNAVAILABLE, InvalidMessage
from shared.domain.messages import SignReply, SignRequest, decode, encode
from shared.messaging.amqp import Broker
from shared.messaging.signing import declare_signer_queue
from shared.objects import check_key
from shared.objects.presign import Credentials, Presigner, region_from_environment
from shared.operations import grants
from shared.store.db import Pool

logger = logging.getLogger(__name__)

#: Requests answered at once by one replica.
_AT_ONCE: Final = 32


@dataclass(frozen=True)
class Links:
    """The signed links of the S3 store `store_url` (`s3://BUCKET/PREFIX`), each good for
    `link_s` seconds."""

    store_url: str
    presigner: Presigner
    link_s: int

    @classmethod
    def of_store(cls, store_url: str, endpoint_url: str, link_s: int) -> "Links":
        """The links of an S3 store at `endpoint_url`, with the credentials of this process's
        environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
        `AWS_REGION`)."""
        bucket = urlsplit(store_url).netloc
        presigner = Presigner(
            bucket, Credentials.from_environment(), region_from_environment(), endpoint_url
        )
        return cls(store_url, presigner, link_s)

    @property
    def prefix(self) -> str:
        return urlsplit(self.store_url).path.strip("/")

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def signed(self, request: SignRequest) -> SignReply:
        """The links `request` asks for, signed with no question asked (`Signer.answer` asks
        the database first)."""
        key, sign, link_s = self._full(request.key), self.presigner.sign, self.link_s
        if request.op in ("get", "head"):
            return SignReply(urls=[sign(request.op.upper(), key, link_s)])
        if request.sha256 is None and request.op != "parts":
            return SignReply(refused=f"a {request.op} names the sha256 the object carries")
        if request.op == "put":
            headers = {"if-none-match": "*", "x-amz-meta-sha256": request.sha256 or ""}
            return SignReply(urls=[sign("PUT", key, link_s, headers=headers)], headers=headers)
        if request.op == "create":
            headers = {"x-amz-meta-sha256": request.sha256 or ""}
            url = sign("POST", key, link_s, query={"uploads": ""}, headers=headers)
            return SignReply(urls=[url], headers=headers)
        if not request.upload_id:
            return SignReply(refused="parts name their upload")
        upload = {"uploadId": request.upload_id}
        parts = range(request.first_part, request.first_part + request.parts)
        return SignReply(
            urls=[sign("PUT", key, link_s, query={**upload, "partNumber": str(n)}) for n in parts],
            complete=sign("POST", key, link_s, query=upload),
            abort=sign("DELETE", key, link_s, query=upload),
        )


@dataclass(frozen=True)
class Signer:
    """Signs `links` for the hosts that may have them, as the database (`pool`) says."""

    pool: Pool
    links: Links

    @classmethod
    def of_store(cls, pool: Pool, store_url: str, endpoint_url: str, link_s: int) -> "Signer":
        """The signer of an S3 store (`Links.of_store`)."""
        return cls(pool, Links.of_store(store_url, endpoint_url, link_s))

    async def answer(self, request: SignRequest) -> SignReply:
        """The links `request` asks for, or why the host may not have them."""
        try:
            check_key(request.key)
        except ValueError as exc:
            return SignReply(refused=str(exc))
        asker = grants.Asker(request.host_id, request.task_id, request.claim)
        async with self.pool.acquire() as conn:
            if request.op in ("get", "head"):
                why = await grants.why_not_read(conn, asker, request.key, self.links.store_url)
            else:
                why = await grants.why_not_write(conn, asker, request.key)
        if why is not None:
            logger.warning(
                "signer: refused host %s %s %s: %s", asker.host_id, request.op, request.key, why
            )
            return SignReply(refused=why)
        return self.links.signed(request)

    async def serve(self, broker: Broker, stop: asyncio.Event) -> None:
        """Answer the signer's queue until `stop`."""
        channel = await broker.channel_for_consuming(_AT_ONCE)
        queue = await declare_signer_queue(channel, broker.topology)

        async def deliver(incoming: AbstractIncomingMessage) -> None:
            await self._deliver(channel, incoming)

        tag = await queue.consume(deliver)
        logger.info("signer: signing links of %s for hosts", self.links.store_url)
        try:
            await stop.wait()
        finally:
            if not channel.is_closed:
                await queue.cancel(tag)
                await channel.close()

    async def _deliver(self, channel: AbstractChannel, incoming: AbstractIncomingMessage) -> None:
        """Answer one request (no answer to a request the signer cannot read: its asker
        gives up); a database that is away is waited for, briefly."""
        async with incoming.process(ignore_processed=True):
            try:
                request = decode(incoming.body)
            except InvalidMessage as exc:
                logger.warning("signer: dropped a request it cannot read: %s", exc)
                return
            if not isinstance(request, SignRequest) or not incoming.reply_to:
                logger.warning("signer: dropped a %s with no reply-to", request.type)
                return
            reply = await self._answer_patiently(request)
            if reply is None:  # its asker, unanswered, tries again as for a failing store
                return
            await channel.default_exchange.publish(
                aio_pika.Message(
                    encode(reply),
                    content_type="application/json",
                    correlation_id=incoming.correlation_id,
                ),
                routing_key=incoming.reply_to,
            )

    async def _answer_patiently(self, request: SignRequest) -> SignReply | None:
        """The answer; None when the database stayed away for a few tries (no answer is
        better than a refusal that is not one)."""
        for pause in (0.5, 1.0, 2.0):
            try:
                return await self.answer(request)
            except UNAVAILABLE as exc:
                logger.warning("signer: the database is away (%s): asked again", exc)
                await asyncio.sleep(pause)
        return None
