"""A bench leaves the broker and the database server as it found them.

Its clean-up runs in a `finally`, with SIGINT ignored (a second Ctrl-C would otherwise leave
half of it undone), each step on its own (one that fails does not skip the others).
"""

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger(__name__)

_Handler = Callable[[int, FrameType | None], object] | int | None


@contextmanager
def signal_ignored(signum: int) -> Iterator[None]:
    """`signum` ignored inside, its handler back after."""
    before: _Handler = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, before)


def each(steps: list[tuple[str, Callable[[], object]]]) -> None:
    """Run every clean-up step, SIGINT ignored; a failing step is reported and the next runs."""
    with signal_ignored(signal.SIGINT):
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # the others still run; the operator is told what is left
                print(f"  clean-up: {what} failed: {exc!r}", flush=True)
