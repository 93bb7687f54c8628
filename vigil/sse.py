"""Reading the `GET /events` stream: Server-Sent Events lines in, `Event`s out.

Each message the API sends is `data: {"routing_key": "<key>", "body": {...}}` with the default
event type, followed by a blank line; lines starting with `:` (`: keepalive`) are comments.
Parsing follows the SSE rules (html.spec.whatwg.org, "Server-sent events"): several `data`
lines join with newlines, one space after the colon is dropped, unknown fields are ignored.
"""

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One message of the events exchange: its routing key and JSON body."""

    routing_key: str
    body: dict[str, Any]


@dataclass
class EventParser:
    """Incremental parser: `feed(line)` returns the event that a blank line completes, if any.

    Messages with another event type, or whose data is not an event, are logged and skipped:
    one odd message must not end a long-running listener.
    """

    _data: list[str] = field(default_factory=list)
    _type: str = "message"

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
        return None

    def _dispatch(self) -> Event | None:
        data, kind = "\n".join(self._data), self._type
        self._data, self._type = [], "message"
        if not data or kind != "message":
            return None
        return parse_event(data)


def parse_event(data: str) -> Event | None:
    """The `Event` in one message's data, or None (logged) when it is not one."""
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
    return Event(routing_key=key, body=body)


def events_in(lines: Iterable[str]) -> Iterator[Event]:
    """Every event in a stream of lines, in order."""
    parser = EventParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event
