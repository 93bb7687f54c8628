"""Several events of one job in one message (issue 41).

A task's normal path writes seven events (`task.new`, then three for its take and three for
its end), each of which the relay published as a message of its own: a publish, a route and a
confirm each, most of the leading scheduler's and the broker's work per task. The relay now
sends each run of consecutive events of one subject (the key's last part: a job, or a host)
as one message, of at most `MOST` events:

- routed as each of its events would be: its routing key is the first event's, and the
  header `CC` (RabbitMQ's sender-selected distribution) names the other events' keys, so a
  queue bound to any of them gets the message, once;
- its body is a JSON array of `{"routing_key": <key>, "body": <the event's body>}`, in order
  (the shape of a `GET /events` frame); the header `events` says how many;
- its header `seq` is its last event's position (each event's own is in its body).

A run of one event is sent as before: its body is the event's, with no `CC` and no `events`.
A queue bound to some of a bundle's keys gets all of its events: a consumer keeps those it
follows (`unbundle`, then its own filter). Events keep their order: a bundle holds consecutive
events only, and bundles go out in the order of their first event.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

#: The most events one message carries.
MOST: Final = 100
#: The header that says how many events a bundle carries.
COUNT_HEADER: Final = "events"


def subject(routing_key: str) -> str:
    """What an event is about: its key's last part (`task.on_cpu.j-1` is about `j-1`)."""
    return routing_key.rpartition(".")[2]


def runs(keys: Sequence[str], most: int = MOST) -> list[range]:
    """The events, by their keys in order, cut into runs of consecutive events of one subject,
    each of at most `most`."""
    subjects = [subject(key) for key in keys]
    found: list[range] = []
    start = 0
    for n in range(1, len(keys) + 1):
        if n == len(keys) or n - start == most or subjects[n] != subjects[start]:
            found.append(range(start, n))
            start = n
    return found


def copied_to(keys: Sequence[str]) -> list[str]:
    """A bundle's `CC`: the keys of its events other than the first's, each once, in order."""
    first = keys[0]
    return [key for key in dict.fromkeys(keys) if key != first]


def bundle_body(keys: Sequence[str], bodies: Sequence[bytes]) -> bytes:
    """A bundle's body from its events' keys and JSON bodies (copied, never decoded)."""
    heads = {key: b'{"routing_key":' + json.dumps(key).encode() + b',"body":' for key in keys}
    parts = (heads[key] + body + b"}" for key, body in zip(keys, bodies, strict=True))
    return b"[" + b",".join(parts) + b"]"


def unbundle(
    routing_key: str, headers: Mapping[str, Any] | None, body: bytes
) -> list[tuple[str, Any]]:
    """The events a message carries, each as (routing key, decoded body), in order."""
    value = json.loads(body)
    if not (headers or {}).get(COUNT_HEADER) or not isinstance(value, list):
        return [(routing_key, value)]
    return [(str(event["routing_key"]), event["body"]) for event in value]
