"""Patience with an object store that fails (unreachable, refusing): an operation tried again
with a growing pause, for at most the worker's patience (`VIGIL_STORE_PATIENCE_S`). Stage-out
(`stage_out.py`) and stage-in (`stage_in.py`) wait so before they fail a task as the
platform's."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from shared.objects import ObjectStoreError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The first pause after a failed try, doubled after each, up to the last.
FIRST_PAUSE_S: Final = 0.5
LAST_PAUSE_S: Final = 15.0


class StoreUnreachable(Exception):
    """The store failed every try for the whole patience: how long was waited, the last
    error."""

    def __init__(self, waited_s: float, last: ObjectStoreError) -> None:
        super().__init__(waited_s, last)
        self.waited_s, self.last = waited_s, last


async def patiently(
    call: Callable[[], Awaitable[T]],
    patience_s: float,
    waiting: str,
    *,
    final: tuple[type[ObjectStoreError], ...] = (),
) -> T:
    """`call()`'s answer, tried again while it raises `ObjectStoreError` (but those of `final`,
    raised at once: an answer, not a failure), each failure logged as `waiting`; then
    `StoreUnreachable` once the next pause would pass `patience_s` seconds."""
    started = time.monotonic()
    pause = FIRST_PAUSE_S
    while True:
        try:
            return await call()
        except final:
            raise
        except ObjectStoreError as exc:
            waited = time.monotonic() - started
            if waited + pause > patience_s:
                raise StoreUnreachable(waited, exc) from exc
            logger.warning("%s (%s): again in %.1f s", waiting, exc, pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LAST_PAUSE_S)
