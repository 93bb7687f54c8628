"""Reading the `GET /events` stream: Server-Sent Events lines in, `Event`s out.

Each message the API sends is `data: {"routing_key": "<key>", "body": {...}}` with the default
event type, followed by a blank line; a job or task event is preceded by `id: <position>` (its
`seq`, in the body too); lines starting with `:` (`: keepalive`) are comments.
Parsing follows the SSE rules (html.spec.whatwg.org, "Server-sent events"): several `data`
lines join with newlines, one space after the colon is dropped, unknown fields are ignored.
"""

import json
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One message of the events exchange: its routing key, JSON body and position (`seq`:
    job and task events have one, log lines None)."""

    routing_key: str
    body: dict[str, Any]
    seq: int | None = None


@dataclass
class EventParser:
    """Incremental parser: `feed(line)` returns the event that a blank line completes, if any.

    Messages with another event type, or whose data is not an event, are logged and skipped:
    one odd message must not end a long-running listener.
    """

    _data: list[str] = field(default_factory=list)
    _type: str = "message"
    _id: str | None = None
    #: The last position the stream gave: an event's, or the one the API sends as the stream
    #: opens (where it starts) — what a reconnecting reader resumes after.
    position: int | None = None

    def feed(self, line: str) -> Event | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id":
            self._id = value
        return None

    def _dispatch(self) -> Event | None:
        data, kind, given = "\n".join(self._data), self._type, self._id
        self._data, self._type, self._id = [], "message", None
        if given is not None and given.isascii() and given.isdigit():
            self.position = int(given)
        if not data or kind != "message":
            return None
        return parse_event(data, given)


def parse_event(data: str, given_id: str | None = None) -> Event | None:
    """The `Event` in one message's data (and `id:` field), or None (logged) when it is not
    one."""
    try:
        decoded = json.loads(data)
    except ValueError:
        logger.warning("skipping an event whose data is not JSON: %.200r", data)
        return None
    key = decoded.get("routing_key") if isinstance(decoded, dict) else None
    body = decoded.get("body") if isinstance(decoded, dict) else None
    if not isinstance(key, str) or not isinstance(body, dict):
        logger.warning("skipping an event without routing_key and body: %.200r", data)
        return None
    return Event(routing_key=key, body=body, seq=_position(given_id, body))


def _position(given_id: str | None, body: dict[str, Any]) -> int | None:
    """The event's position: its `id:` field, else the `seq` of its body, else None."""
    if given_id is not None and given_id.isascii() and given_id.isdigit():
        return int(given_id)
    seq = body.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


class EventStream(Iterator[Event]):
    """The events of a stream of lines, in order; `position` is where a reader that stopped
    here resumes after."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = iter(lines)
        self._parser = EventParser()

    @property
    def position(self) -> int | None:
        return self._parser.position

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> Event:
        for line in self._lines:
            event = self._parser.feed(line)
            if event is not None:
                return event
        raise StopIteration


class AsyncEventStream(AsyncIterator[Event]):
    """`EventStream` over lines that come asynchronously."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines
        self._parser = EventParser()

    @property
    def position(self) -> int | None:
        return self._parser.position

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __anext__(self) -> Event:
        async for line in self._lines:
            event = self._parser.feed(line)
            if event is not None:
                return event
        raise StopAsyncIteration


def events_in(lines: Iterable[str]) -> Iterator[Event]:
    """Every event in a stream of lines, in order."""
    return EventStream(lines)


@dataclass
class Resume:
    """Where a follower is in the event sequence: it delivers each positioned event once, in
    order, and reopens a broken stream after `last`."""

    last: int | None = None

    def fresh(self, event: Event) -> bool:
        """Whether to deliver the event (not seen yet; log lines always are)."""
        return event.seq is None or self.last is None or event.seq > self.last

    def reached(self, position: int | None) -> None:
        """The stream has given everything through `position`."""
        if position is not None and (self.last is None or position > self.last):
            self.last = position
