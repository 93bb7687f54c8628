"""Queued frames joined into one write: the same bytes, in order, each drained once written."""

import asyncio
import inspect

import aiormq.connection
from aiormq.abc import ChannelFrame

import shared.messaging.amqp  # noqa: F401  (installs the generator, as every service does)
from shared.messaging.frame_batching import (
    MAX_JOINED_BYTES,
    WRITE_QUEUE_FRAMES,
    CoalescingFrameGenerator,
    join_queued,
)


def _frame(payload: bytes, *, drained: bool = False, close: bool = False) -> ChannelFrame:
    future = asyncio.get_running_loop().create_future() if drained else None
    return ChannelFrame(payload=payload, should_close=close, drain_future=future)


def _queue(*frames: ChannelFrame) -> "asyncio.Queue[ChannelFrame]":
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    for frame in frames:
        queue.put_nowait(frame)
    return queue


async def test_what_is_queued_behind_a_frame_goes_with_it_in_order() -> None:
    queue = _queue(_frame(b"b"), _frame(b"c"))
    joined = join_queued(_frame(b"a"), queue)
    assert joined.payload == b"abc"
    assert queue.empty()


async def test_a_frame_alone_is_written_as_it_is() -> None:
    first = _frame(b"a")
    assert join_queued(first, _queue()) is first


async def test_every_joined_publisher_is_told_its_bytes_were_written() -> None:
    # given: two publishers waiting on the drain of their frame, one not waiting
    first, second = _frame(b"a", drained=True), _frame(b"b", drained=True)
    joined = join_queued(first, _queue(_frame(b"-"), second))
    assert joined.should_drain
    # when the writer drained the joined write
    joined.drain()
    # then
    assert first.drain_future is not None and first.drain_future.done()
    assert second.drain_future is not None and second.drain_future.done()
    assert not joined.should_drain


async def test_nothing_is_joined_after_a_frame_that_closes_the_connection() -> None:
    queue = _queue(_frame(b"bye", close=True), _frame(b"late"))
    joined = join_queued(_frame(b"a"), queue)
    assert joined.payload == b"abye"
    assert joined.should_close
    assert queue.qsize() == 1  # left for the writer, which stops at the close
    closing = _frame(b"bye", close=True)
    assert join_queued(closing, _queue(_frame(b"x"))) is closing


async def test_a_joined_write_stays_bounded() -> None:
    big = b"x" * (MAX_JOINED_BYTES // 2)
    queue = _queue(_frame(big), _frame(big), _frame(b"next"))
    joined = join_queued(_frame(big), queue)
    assert len(joined.payload) == 2 * len(big)
    assert queue.qsize() == 2


async def test_the_generator_yields_everything_queued_at_once() -> None:
    queue = _queue(_frame(b"a"), _frame(b"b"), _frame(b"c"))
    generator = CoalescingFrameGenerator(queue)
    assert (await anext(generator)).payload == b"abc"
    assert queue.empty()


def test_aiormq_writer_still_takes_its_frames_from_the_generator_we_install() -> None:
    # A tripwire for an aiormq upgrade: its writer must look FrameGenerator up by name.
    writer = inspect.getsource(aiormq.connection.Connection._Connection__writer)  # type: ignore[attr-defined]
    assert "FrameGenerator(self.write_queue)" in writer
    assert "writer.write(channel_frame.payload)" in writer
    assert aiormq.connection.FrameGenerator is CoalescingFrameGenerator


async def test_a_connection_queues_a_whole_relay_batch_before_a_publisher_waits() -> None:
    # A tripwire for an aiormq upgrade too: its write queue must be sized by the class's
    # FRAME_BUFFER_SIZE (10 frames by default: a batch's 11th publish then waited for room,
    # and each one behind it was written alone).
    connection = aiormq.connection.Connection("amqp://guest:guest@127.0.0.1:5672/")
    assert connection.write_queue.maxsize == WRITE_QUEUE_FRAMES >= 500
