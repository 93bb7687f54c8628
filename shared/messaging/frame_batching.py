"""Frames queued together reach the broker's socket in one write.

aiormq's connection writer takes the frames its channels queue one at a time and writes each
with its own `send()`: a relay batch of twenty confirmed publishes costs twenty system calls
on the scheduler's side and twenty TCP segments for RabbitMQ to read. Publishes that do not
wait for the socket to drain (`Broker.publish`) queue their frames in one loop iteration;
`CoalescingFrameGenerator` hands the writer whatever is queued, joined, in one write.

aiormq bounds a connection's write queue at 10 frames (`Connection.FRAME_BUFFER_SIZE`): the
11th publish of a batch waited for room while holding its channel's lock, and every publish
behind it then went out alone, one `send()` each (a relay batch of 20 to 40 rows
was about two publishes a write, and the scheduler's writes to RabbitMQ a fifth of its CPU).
`install()` raises the bound to `WRITE_QUEUE_FRAMES`, above a relay batch (500 rows), so that
a batch's publishes all queue in the loop iteration that makes them; the queue is still
bounded (the relay's batch and each service's own concurrency bound what is queued anyway).

Nothing about a frame changes: the same bytes in the same order, each publisher's drain
future set once its bytes are written, and a frame that closes the connection still ends the
writer (nothing queued after it is joined). `install()` replaces aiormq's `FrameGenerator`,
which its writer looks up by name; `tests/unit/test_frame_batching.py` fails if aiormq's
writer stops doing so. aiormq is pinned exactly to the release this was checked against
(`verified_releases`, which lists what to re-check before another).
"""

import asyncio
import dataclasses
from typing import Final

import aiormq.connection
from aiormq.abc import ChannelFrame

#: At most this many bytes in one joined write (a queue never holds much more than a batch).
MAX_JOINED_BYTES: Final = 256 * 1024

#: Frames a connection's write queue holds before a publisher waits: more than the publishes
#: of a relay batch (`VIGIL_SCHEDULER_BATCH`, 500 by default; each publish one frame).
WRITE_QUEUE_FRAMES: Final = 4096


@dataclasses.dataclass(frozen=True)
class JoinedFrames(ChannelFrame):
    """Several queued frames as one: their payloads in order; drained together."""

    parts: tuple[ChannelFrame, ...] = ()

    @property
    def should_drain(self) -> bool:
        return any(part.should_drain for part in self.parts)

    def drain(self) -> None:
        for part in self.parts:
            part.drain()


def join_queued(first: ChannelFrame, queue: "asyncio.Queue[ChannelFrame]") -> ChannelFrame:
    """`first` and whatever is queued behind it, up to a closing frame or `MAX_JOINED_BYTES`,
    as one frame (`first` itself when nothing is queued)."""
    if first.should_close or queue.empty():
        return first
    parts, size = [first], len(first.payload)
    while not queue.empty() and not parts[-1].should_close and size < MAX_JOINED_BYTES:
        part = queue.get_nowait()
        queue.task_done()
        parts.append(part)
        size += len(part.payload)
    return JoinedFrames(
        payload=b"".join(part.payload for part in parts),
        should_close=parts[-1].should_close,
        parts=tuple(parts),
    )


class CoalescingFrameGenerator(aiormq.connection.FrameGenerator):
    """aiormq's frame source for its writer, each step everything queued so far."""

    async def __anext__(self) -> ChannelFrame:
        first: ChannelFrame = await super().__anext__()
        return join_queued(first, self.queue)


def install() -> None:
    """Make every aiormq connection opened from now on write queued frames together, with
    room in its write queue for a whole batch of publishes."""
    aiormq.connection.FrameGenerator = CoalescingFrameGenerator  # type: ignore[misc]
    aiormq.connection.Connection.FRAME_BUFFER_SIZE = WRITE_QUEUE_FRAMES
