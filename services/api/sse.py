"""The Server-Sent Events wire format of `GET /events`, and the response that streams it.

Binding contract (clients are built on it):

- each event is one `data:` line and a blank line, default event type (so `EventSource`'s
  `onmessage` fires): `data: {"routing_key": "<key>", "body": <the JSON body>}\\n\\n`;
- `: keepalive\\n\\n` every `keepalive_s` seconds (15 by default), whatever the traffic;
- the stream opens with the comment `: subscribed\\n\\n`; by the time the response headers are
  sent the queue is bound, so every event published afterwards is delivered;
- it ends with the comment `: token revoked\\n\\n` within `CHECK_S` of its token being revoked
  or its user disabled (the token is looked up again every `CHECK_S`).
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.api.event_hub import EventHub, Subscription

logger = logging.getLogger(__name__)

KEEPALIVE: Final = b": keepalive\n\n"
OPENED: Final = b": subscribed\n\n"
REVOKED: Final = b": token revoked\n\n"
#: How often an open stream looks its token up again.
CHECK_S: Final = 1.0

#: Whether the stream's token still works (a database read).
TokenCheck = Callable[[], Awaitable[bool]]


def frame(routing_key: str, body: bytes) -> bytes:
    """One SSE event for a message; a body that is not JSON is passed on as a JSON string."""
    value: Any
    try:
        value = json.loads(body)
    except ValueError:
        value = body.decode("utf-8", "replace")
    # json.dumps escapes every control character, so the data always fits on one line.
    data = json.dumps({"routing_key": routing_key, "body": value}, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


async def frames(
    subscription: Subscription,
    keepalive_s: float,
    still_valid: TokenCheck | None = None,
    check_s: float = CHECK_S,
) -> AsyncIterator[bytes]:
    """The stream's bytes: the opening comment, then events and keepalives until it is closed
    (or, with `still_valid`, until a look every `check_s` finds the token no longer works).

    Each message is acknowledged once it has been handed to the server to send.
    """
    loop = asyncio.get_running_loop()
    yield OPENED
    next_keepalive = loop.time() + keepalive_s
    next_check = loop.time() + check_s if still_valid is not None else float("inf")
    while True:
        try:
            async with asyncio.timeout_at(min(next_keepalive, next_check)):
                message = await subscription.next()
        except TimeoutError:
            if still_valid is not None and loop.time() >= next_check:
                if not await still_valid():
                    yield REVOKED
                    return
                next_check = loop.time() + check_s
            if loop.time() >= next_keepalive:
                yield KEEPALIVE
                next_keepalive = max(next_keepalive + keepalive_s, loop.time())
            continue
        if message is None:
            return
        yield frame(message.routing_key or "", message.body)
        await subscription.ack(message)


class EventStream(StreamingResponse):
    """`text/event-stream` of one subscription, released however the response ends.

    The release is here rather than in the generator: a generator that never started (the
    client left before the headers went out) would never run its `finally`.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        hub: EventHub,
        subscription: Subscription,
        keepalive_s: float,
        still_valid: TokenCheck | None = None,
    ) -> None:
        super().__init__(
            frames(subscription, keepalive_s, still_valid),
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._hub = hub
        self._subscription = subscription

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._hub.release(self._subscription)
            logger.debug("event stream %s closed", self._subscription.name)
