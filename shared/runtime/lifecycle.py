"""The shape every service's main() shares: a stop event set by SIGTERM/SIGINT.

The first signal sets the event (stop intake, drain, close); a second one cancels the main task
(hard stop). Handlers are restored on exit.
"""

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@asynccontextmanager
async def stop_on_signals() -> AsyncIterator[asyncio.Event]:
    """Yield an event set by the first SIGTERM/SIGINT; the second cancels the current task."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            logger.warning("second signal %s: stopping hard", signal.Signals(signum).name)
            if main_task is not None:
                main_task.cancel()
            return
        logger.info("signal %s: stopping gracefully", signal.Signals(signum).name)
        stop.set()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield stop
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`, waking early when `stop` is set; True if stopping."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


async def wait_or_woken(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Sleep up to `seconds`, waking early when `stop` or `wake` is set."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()


async def unless_stopped(stop: asyncio.Event, step: Awaitable[T]) -> T | None:
    """Await `step`, cancelling it if `stop` is set first; None if it was."""
    task = asyncio.ensure_future(step)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else None
