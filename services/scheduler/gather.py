"""The relay's gather under load: how long it waits before its next read, and what cuts the
wait short.

After two busy reads in a row the relay waits `VIGIL_RELAY_GATHER_S` (25 ms) before reading
again, so that what the system writes meanwhile goes out in one batch: one `outbox_batch`
statement, one publish, one round of confirms, whatever the batch holds (`due.gather_wait`).
Most rows under load are a task's passing events, which nobody waits on. Some rows are waited
on: a round's work messages (a host's slots are idle until they come) and a job's end (its
submitter waits for `job.<outcome>`). Written while the relay gathers, they end the gather
(`hurry`): the relay reads at once, and they go out without the wait. A lone job's chain thus
never waits for a gather, and a big job's events are published in batches of about twice as
many rows.
"""

import asyncio

from services.scheduler.due import gather_wait
from shared.runtime.lifecycle import wait_or_woken


class Gather:
    """The gather between the relay's reads: `reading()` as a read starts, `wait()` after it;
    `hurry()` when rows someone waits on were written (a wait under way ends at once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._hurry = asyncio.Event()

    def hurry(self) -> None:
        """Rows someone waits on were written: the next read comes without a gather."""
        self._hurry.set()

    def reading(self) -> None:
        """A read starts: it takes whatever was written before it, hurried or not."""
        self._hurry.clear()

    async def wait(self, stop: asyncio.Event, relayed: int, before: int) -> None:
        """Wait before the next read, after one that published `relayed` rows and one before
        it `before`: the gather if both found rows (`due.gather_wait`), ended early by `stop`
        or `hurry()`; no wait at all if hurried since the read began."""
        seconds = gather_wait(relayed, before, self.seconds)
        if seconds:  # a hurry already set ends it at once
            await wait_or_woken(stop, self._hurry, seconds)
