"""The relay's gather under load, and what cuts it short (`services/scheduler/gather.py`)."""

import asyncio

from services.scheduler.gather import Gather

#: Longer than any test waits for (`asyncio.timeout`): a gather of this length that was not
#: cut short fails the test.
_LONG_S = 60.0
_WITHIN_S = 5.0


async def _waiting(gather: Gather, stop: asyncio.Event) -> "asyncio.Task[None]":
    """The gather after two busy reads, started and still waiting (it ran until it blocked:
    one that returns at once is done by then)."""
    waiting = asyncio.create_task(gather.wait(stop, relayed=9, before=3))
    await asyncio.sleep(0)
    assert not waiting.done()
    return waiting


async def test_work_written_during_a_gather_ends_it() -> None:
    # given a busy relay (two reads in a row found rows) gathering for a minute
    gather, stop = Gather(_LONG_S), asyncio.Event()
    gather.reading()
    waiting = await _waiting(gather, stop)
    # when the round writes work (or ends a job)
    gather.hurry()
    # then the next read comes at once
    async with asyncio.timeout(_WITHIN_S):
        await waiting


async def test_work_written_during_the_read_means_no_gather_after_it() -> None:
    gather, stop = Gather(_LONG_S), asyncio.Event()
    gather.reading()
    gather.hurry()  # written while the read was under way: it may have missed it
    async with asyncio.timeout(_WITHIN_S):
        await gather.wait(stop, relayed=9, before=3)


async def test_a_hurry_before_a_read_is_spent_by_that_read() -> None:
    # given work written, then a read that took it
    gather, stop = Gather(_LONG_S), asyncio.Event()
    gather.hurry()
    gather.reading()
    # then the gather after that read waits (until stopped)
    waiting = await _waiting(gather, stop)
    stop.set()
    async with asyncio.timeout(_WITHIN_S):
        await waiting


async def test_the_gather_waits_its_time_when_nothing_hurries_it() -> None:
    gather, stop = Gather(0.02), asyncio.Event()
    gather.reading()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await gather.wait(stop, relayed=9, before=3)
    assert loop.time() - began >= 0.02


async def test_after_a_quiet_moment_the_relay_reads_again_without_a_gather() -> None:
    gather, stop = Gather(_LONG_S), asyncio.Event()
    gather.reading()
    async with asyncio.timeout(_WITHIN_S):
        await gather.wait(stop, relayed=9, before=0)  # the first read after a quiet moment
        await gather.wait(stop, relayed=0, before=9)  # nothing left: the loop waits for a wake
