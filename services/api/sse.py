"""The Server-Sent Events wire format of `GET /events`, and the response that streams it.

Binding contract (clients are built on it):

- each event is one `data:` line and a blank line, default event type (so `EventSource`'s
  `onmessage` fires): `data: {"routing_key": "<key>", "body": <the JSON body>}\\n\\n`; a job or
  task event is preceded by `id: <position>` (its `seq`, in the body too), so a client that
  reconnects with `Last-Event-ID` (or `after=`) resumes after it; log lines have no position;
- events with positions come in increasing order, each once, with no gap: the stream reads
  them from the history (`shared.store.event_log`), and the broker's deliveries only wake it;
- `: keepalive\\n\\n` every `keepalive_s` seconds (15 by default), whatever the traffic;
- the stream opens with the comment `: subscribed\\n\\n` (followed by `id: <position>`, where it
  starts, when it follows job or task events: a client that reconnects before any event came
  resumes from there); by the time the response headers are sent the queue is bound, so every
  event published afterwards is delivered;
- it ends with the comment `: token revoked\\n\\n` within `CHECK_S` of its token being revoked
  or its user disabled (the token is looked up again every `CHECK_S`).
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from aio_pika.abc import AbstractIncomingMessage
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.api.event_hub import WAKE, Delivery, EventHub, Subscription
from shared.store.event_log import LoggedEvent

logger = logging.getLogger(__name__)

KEEPALIVE: Final = b": keepalive\n\n"
OPENED: Final = b": subscribed\n\n"
REVOKED: Final = b": token revoked\n\n"
#: How often an open stream looks its token up again.
CHECK_S: Final = 1.0
#: How often a quiet stream reads the history anyway (events whose delivery the broker lost).
POLL_S: Final = 5.0
#: How often it reads it while its link to the broker is lost (nothing wakes it then).
LOST_POLL_S: Final = 0.5

#: Whether the stream's token still works (a database read).
TokenCheck = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class History:
    """Where a stream reads its numbered events: `read(position)` gives those after it
    (matching the stream's topics, at most `page`), and the stream starts after `start`."""

    read: Callable[[int], Awaitable[list[LoggedEvent]]]
    start: int
    page: int


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


def opened_at(position: int) -> bytes:
    """The opening of a stream that starts after `position` (an id-only message: it sets an
    `EventSource`'s last event id, and fires no event)."""
    return b": subscribed\nid: %d\n\n" % position


def numbered_frame(event: LoggedEvent) -> bytes:
    """One SSE event of the history, with its position as the event id. The body is
    PostgreSQL's text of a jsonb value: JSON on one line (control characters escaped)."""
    key = json.dumps(event.routing_key)
    data = f'{{"routing_key":{key},"body":{event.body}}}'
    return f"id: {event.seq}\ndata: {data}\n\n".encode()


def position_of(message: AbstractIncomingMessage) -> int | None:
    """The position a delivered event carries (header `seq`), None for a log line."""
    seq = (message.headers or {}).get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


class _Deadlines:
    """When a stream next sends a keepalive, looks at its token, and polls its history."""

    def __init__(self, keepalive_s: float, check_s: float | None, poll_s: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self.keepalive_s, self.check_s, self.poll_s = keepalive_s, check_s, poll_s
        now = self._loop.time()
        self.keepalive = now + keepalive_s
        self.check = now + check_s if check_s is not None else float("inf")
        self.poll = now + poll_s if poll_s is not None else float("inf")

    def next(self) -> float:
        return min(self.keepalive, self.check, self.poll)

    def passed(self, deadline: float) -> bool:
        return self._loop.time() >= deadline

    def sent(self) -> None:
        """Something was sent: no keepalive is needed for a while."""
        self.keepalive = self._loop.time() + self.keepalive_s

    def keepalive_sent(self) -> None:
        self.keepalive = max(self.keepalive + self.keepalive_s, self._loop.time())

    def checked(self) -> None:
        if self.check_s is not None:
            self.check = self._loop.time() + self.check_s

    def polled(self, lost: bool = False) -> None:
        """The history was read: the next look is due in `poll_s` (`LOST_POLL_S` while the
        broker's deliveries are missing)."""
        if self.poll_s is not None:
            self.poll = self._loop.time() + (min(LOST_POLL_S, self.poll_s) if lost else self.poll_s)


class _Reader:
    """A stream's place in the history: the last position sent, and whether the history may
    hold newer events for it. Without a history (log lines only) it never reads."""

    def __init__(self, history: History | None) -> None:
        self.history = history
        self.last = history.start if history is not None else 0
        self.behind = history is not None

    async def read(self) -> list[bytes]:
        """The frames of the next page after `last` (and whether more may wait, in `behind`)."""
        if self.history is None:
            return []
        events = await self.history.read(self.last)
        if events:
            self.last = events[-1].seq
        self.behind = len(events) >= self.history.page
        return [numbered_frame(e) for e in events]

    def poll(self) -> None:
        """Read again, in case the broker lost a delivery."""
        self.behind = self.history is not None

    def delivered(self, delivery: Delivery) -> AbstractIncomingMessage | None:
        """Note a delivery; the message when it is to be passed on as it is (it has no
        position). `WAKE` (the link to the broker lost or restored) reads the history."""
        if delivery == WAKE:
            self.poll()
            return None
        assert not isinstance(delivery, str)
        seq = position_of(delivery) if self.history is not None else None
        if seq is None:
            return delivery
        self.behind = self.behind or seq > self.last
        return None


#: What `_next_delivery` gives when a deadline passed first.
_QUIET: Final = "quiet"


async def _next_delivery(
    subscription: Subscription, deadlines: _Deadlines
) -> Delivery | Literal["quiet"] | None:
    """The next delivery (None once closed), or `_QUIET` when the next deadline came first."""
    message = subscription.next_nowait()
    if message is not None:
        return message
    try:
        async with asyncio.timeout_at(deadlines.next()):
            return await subscription.next()
    except TimeoutError:
        return _QUIET


async def _revoked(still_valid: TokenCheck | None, deadlines: _Deadlines) -> bool:
    """Whether the token, looked at again when that is due, no longer works."""
    if still_valid is None or not deadlines.passed(deadlines.check):
        return False
    deadlines.checked()
    return not await still_valid()


def _quiet(reader: _Reader, deadlines: _Deadlines) -> bool:
    """A deadline passed with no delivery: poll the history if due; True when a keepalive is
    to be sent now."""
    if deadlines.passed(deadlines.poll):
        reader.poll()
    if not deadlines.passed(deadlines.keepalive):
        return False
    deadlines.keepalive_sent()
    return True


async def frames(
    subscription: Subscription,
    keepalive_s: float,
    history: History | None = None,
    still_valid: TokenCheck | None = None,
    check_s: float = CHECK_S,
) -> AsyncIterator[bytes]:
    """The stream's bytes: the opening comment, then events and keepalives until it is closed
    (or, with `still_valid`, until a look every `check_s` finds the token no longer works).

    With `history`, events with a position are read from it (after `history.start` first,
    then whenever a delivery says there is a newer one, when the link to the broker is lost and
    when it is restored, and every `POLL_S`, or `LOST_POLL_S` while it is lost); deliveries
    without a position (log lines) are passed on as they come. Each delivery is acknowledged
    once handled.
    """
    reader = _Reader(history)
    deadlines = _Deadlines(
        keepalive_s,
        check_s if still_valid is not None else None,
        POLL_S if history is not None else None,
    )
    yield OPENED if history is None else opened_at(history.start)
    while True:
        if reader.behind:
            for chunk in await reader.read():
                yield chunk
                deadlines.sent()
            deadlines.polled(subscription.lost)
        if await _revoked(still_valid, deadlines):
            yield REVOKED
            return
        if reader.behind:
            continue  # a long replay: the next page at once
        delivery = await _next_delivery(subscription, deadlines)
        if delivery == _QUIET:
            if _quiet(reader, deadlines):
                yield KEEPALIVE
            continue
        if delivery is None:
            return
        passed_on = reader.delivered(delivery)
        if passed_on is not None:
            yield frame(passed_on.routing_key or "", passed_on.body)
        await subscription.ack(delivery)


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
        history: History | None = None,
        still_valid: TokenCheck | None = None,
    ) -> None:
        super().__init__(
            frames(subscription, keepalive_s, history, still_valid),
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
