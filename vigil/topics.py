"""AMQP topic patterns, matched client-side to pick the callbacks an event goes to.

A routing key and a pattern are words separated by `.`; in a pattern `*` stands for exactly
one word and `#` for zero or more, as on a RabbitMQ topic exchange (`task.*.j-1` matches
`task.completed.j-1`; `job.#` matches `job`, `job.failed` and `job.failed.j-1`).
"""

import re
from functools import lru_cache
from typing import Final, Generic, TypeVar

from vigil.errors import UsageError

#: RabbitMQ's limit on a routing key (and so on a binding pattern), in bytes.
MAX_PATTERN_BYTES: Final = 255
_PRINTABLE_RE: Final = re.compile(r"[\x21-\x7e]+")

H = TypeVar("H")


def check_pattern(pattern: str) -> str:
    """`pattern` itself; raises `UsageError` when it cannot be a topic pattern."""
    if not _PRINTABLE_RE.fullmatch(pattern):
        raise UsageError(
            f"topic pattern {pattern[:100]!r} must be non-empty visible ASCII without spaces"
        )
    if len(pattern.encode()) > MAX_PATTERN_BYTES:
        raise UsageError(f"topic pattern is longer than {MAX_PATTERN_BYTES} bytes")
    return pattern


def matches(pattern: str, routing_key: str) -> bool:
    """True when `routing_key` matches the topic `pattern` (`*` one word, `#` zero or more)."""
    return _match(tuple(pattern.split(".")), tuple(routing_key.split(".")))


@lru_cache(maxsize=4096)
def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        # `#` takes no word, or one word and is still there to take more.
        return _match(rest, words) or (bool(words) and _match(pattern, words[1:]))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(rest, words[1:])


class Subscriptions(Generic[H]):
    """Callbacks registered by topic pattern, in registration order."""

    def __init__(self) -> None:
        self._entries: list[tuple[str, H]] = []

    def add(self, pattern: str, handler: H) -> None:
        """Register `handler` for events matching `pattern` (checked: `UsageError`)."""
        self._entries.append((check_pattern(pattern), handler))

    def patterns(self) -> list[str]:
        """The distinct patterns to subscribe to; `UsageError` when there are none."""
        if not self._entries:
            raise UsageError("no callback registered: call on(pattern, fn) first")
        return list(dict.fromkeys(pattern for pattern, _ in self._entries))

    def handlers_for(self, routing_key: str) -> list[H]:
        """The callbacks whose pattern matches `routing_key`, in registration order."""
        return [handler for pattern, handler in self._entries if matches(pattern, routing_key)]
