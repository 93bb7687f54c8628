"""A relay batch published in one step, each message still confirmed on its own.

aiormq's `basic_publish` is made for one message: each call enters a timeout scope and a
close guard, takes the channel's lock, queues its own frame and waits for its own confirm,
and the relay ran one coroutine per row to call it (`asyncio.gather`). py-spy on a leading
scheduler that fed 100 simulated hosts put a fifth of its CPU there.

`publish_together` does under one lock what `basic_publish` does for each message: it numbers
the messages with the channel's next delivery tags, registers a confirmation future for each
(keyed by tag, and by message id for a `basic.return`, as aiormq's own frame handlers expect),
and queues all their frames as one. Then it waits for every confirm at once. What comes back
is per message:
- None for an ack;
- `DeliveryError` for a nack;
- `PublishError` for a mandatory message the broker returned;
- `TimeoutError` for no confirm within the timeout;
- `ChannelInvalidStateError` for a channel that closed first.

The bytes on the wire and the broker's confirms are those of as many `basic_publish` calls.

Every message of a batch is persistent JSON with an id (a random one if none is given) and,
for an event, headers (`Outgoing`); its frames are written by `publish_frames`, not by pamqp,
whose generic marshalling of each frame and property was a fifth of the relay's CPU
(`bench/relay.py`); the headers' table is pamqp's own encoding. The bytes are pamqp's
(`tests/unit/test_publish_frames.py` holds them to it).

It reaches into aiormq's channel (`lock`, `delivery_tag`, `confirmations`,
`message_id_delivery_tag`, `write_queue`, `max_content_size`), as `frame_batching` does into its
connection. `tests/integration/test_batch_publish.py` fails if aiormq stops keeping them, and
aiormq is pinned exactly to the release this was checked against (`verified_releases`).
"""

import asyncio
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from random import getrandbits
from typing import Final
from uuid import UUID

import aiormq
import pamqp.encode
from aiormq.abc import ChannelFrame
from aiormq.exceptions import ChannelInvalidStateError
from pamqp.commands import Basic
from pamqp.common import FieldTable


@dataclass(frozen=True)
class Outgoing:
    """One message of a batch: persistent JSON."""

    exchange: str
    routing_key: str
    body: bytes
    mandatory: bool
    #: None: a random one.
    message_id: str | None = None
    headers: FieldTable | None = None


#: Basic.Publish (class 60, method 40) and its reserved ticket.
_PUBLISH: Final = struct.pack(">HHH", 60, 40, 0)
#: The property flags (content type, headers, delivery mode, message id: bits 15, 13, 12, 7).
_CONTENT_TYPE, _HEADERS, _DELIVERY_MODE, _MESSAGE_ID = 0x8000, 0x2000, 0x1000, 0x0080
_JSON: Final = b"\x10application/json"
_PERSISTENT: Final = b"\x02"
_FRAME_END: Final = b"\xce"


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + _FRAME_END


def _short(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"too long for an AMQP short string: {text[:40]!r}...")
    return bytes((len(raw),)) + raw


def publish_frames(channel: int, max_content: int, message: Outgoing, message_id: str) -> bytes:
    """The frames of `message`'s publish (`content_type` application/json, `delivery_mode`
    2, its headers if any, `message_id`), its body cut in frames of `max_content` bytes at
    most: what pamqp writes for them."""
    method = (
        _PUBLISH
        + _short(message.exchange)
        + _short(message.routing_key)
        + (b"\x01" if message.mandatory else b"\0")
    )
    body = message.body
    if message.headers:
        flags = _CONTENT_TYPE | _HEADERS | _DELIVERY_MODE | _MESSAGE_ID
        properties = _JSON + pamqp.encode.field_table(message.headers) + _PERSISTENT
    else:
        flags = _CONTENT_TYPE | _DELIVERY_MODE | _MESSAGE_ID
        properties = _JSON + _PERSISTENT
    header = struct.pack(">HHQH", 60, 0, len(body), flags) + properties + _short(message_id)
    frames = [_frame(1, channel, method), _frame(2, channel, header)]
    frames += (
        _frame(3, channel, body[at : at + max_content]) for at in range(0, len(body), max_content)
    )
    return b"".join(frames)


async def publish_together(
    channel: aiormq.Channel, messages: Sequence[Outgoing], confirm_within_s: float
) -> list[BaseException | None]:
    """Publish `messages` in order on `channel` and wait for their confirms, at most
    `confirm_within_s` seconds; what became of each, in order (None: confirmed). The channel
    confirms publishes and raises a return as `PublishError` (`amqp.open_broker`'s does).
    Raises only if none was sent (the channel closed, a message that cannot be written: a
    name over 255 bytes, or this call was cancelled first)."""
    if not (channel.publisher_confirms and channel.on_return_raises):
        raise ValueError("publish_together needs confirms, and returns raised, on its channel")
    if not messages:
        return []
    confirmations = await _send(channel, messages)
    done, pending = await asyncio.wait(confirmations, timeout=confirm_within_s)
    for confirmation in pending:
        confirmation.cancel()  # aiormq logs a late confirm of a cancelled future, and drops it
    return [_outcome(confirmation, confirmation in done) for confirmation in confirmations]


async def _send(
    channel: aiormq.Channel, messages: Sequence[Outgoing]
) -> list[asyncio.Future[object]]:
    """Write every message's frames, then number, register and queue them under the
    channel's lock (one frame)."""
    number, max_content = channel.number, channel.max_content_size
    ids = [m.message_id or UUID(int=getrandbits(128), version=4).hex for m in messages]
    # every message's frames first: one that cannot be written registers no tag
    payload = b"".join(
        publish_frames(number, max_content, message, message_id)
        for message, message_id in zip(messages, ids, strict=True)
    )
    async with channel.lock:
        first_tag = channel.delivery_tag + 1
        confirmations: list[asyncio.Future[object]] = []
        for offset, message_id in enumerate(ids):
            tag = first_tag + offset
            confirmation = channel.create_future()
            channel.confirmations[tag] = confirmation
            channel.message_id_delivery_tag[message_id] = tag
            confirmation.add_done_callback(_forget(channel, message_id, tag))
            confirmations.append(confirmation)
        channel.delivery_tag = first_tag + len(messages) - 1
        try:
            await channel.write_queue.put(ChannelFrame(payload=payload, should_close=False))
        except BaseException:
            # Not queued: the broker never saw these tags; give them back under the lock.
            channel.delivery_tag = first_tag - 1
            for offset, confirmation in enumerate(confirmations):
                channel.confirmations.pop(first_tag + offset, None)
                confirmation.cancel()
            raise
    return confirmations


def _forget(channel: aiormq.Channel, message_id: str, tag: int) -> Callable[[object], None]:
    def forget(_: object) -> None:
        if channel.message_id_delivery_tag.get(message_id) == tag:
            channel.message_id_delivery_tag.pop(message_id)

    return forget


def _outcome(confirmation: "asyncio.Future[object]", done: bool) -> BaseException | None:
    if not done:
        return TimeoutError("no confirm from the broker in time")
    if confirmation.cancelled():
        return ChannelInvalidStateError("the channel closed before the confirm")
    error = confirmation.exception()
    if error is not None:
        return error
    result = confirmation.result()
    return None if isinstance(result, Basic.Ack) else RuntimeError(f"not a confirm: {result!r}")
