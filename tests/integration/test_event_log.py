"""The event history: positions given by the relay's read, gap-free for readers, replay by
topics and by job, retention.

The module works in a database of its own (positions are installation-wide) and empties the
outbox and the history before each test.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from shared.domain import topics
from shared.domain.messages import JobEvent, JobOutcome, TaskEvent
from shared.domain.states import TaskState
from shared.store import db, event_log, outbox
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def events_database_url() -> Iterator[str]:
    with fresh_database("vigil_event_log") as url:
        yield url


@pytest.fixture
async def epool(events_database_url: str) -> AsyncIterator[db.Pool]:
    """A pool on the module's database, with an empty outbox and history."""
    async with db.open_pool(events_database_url, max_size=8) as pool:
        await pool.execute("TRUNCATE outbox, events RESTART IDENTITY")
        await pool.execute("UPDATE event_positions SET last_given = 0, pruned_through = 0")
        yield pool


def _event(job: str = "j-1", state: TaskState = TaskState.ON_CPU) -> TaskEvent:
    return TaskEvent(job_id=job, task_id=f"t-{uuid.uuid4().hex[:8]}", state=state)


async def _write(pool: db.Pool, *events: TaskEvent | JobEvent) -> None:
    async with pool.acquire() as conn, conn.transaction():
        for event in events:
            if isinstance(event, TaskEvent):
                await outbox.add_task_event(conn, event)
            else:
                await outbox.add_job_event(conn, event)


async def _relay_all(pool: db.Pool) -> list[outbox.OutboxRow]:
    """Read and mark batches until nothing is pending, as the relay does."""
    seen: list[outbox.OutboxRow] = []
    mark: list[int] = []
    async with pool.acquire() as conn:
        while True:
            rows = await outbox.pending(conn, 7, confirmed=mark)
            if not rows:
                return seen
            seen += rows
            mark = [r.id for r in rows]


ALL = topics.parse_all(["job.*.#", "task.*.#"])


async def test_events_are_numbered_in_order_and_work_messages_are_not(epool: db.Pool) -> None:
    # given
    await _write(epool, _event(), JobEvent(job_id="j-1", outcome=JobOutcome.SUCCEEDED))
    # when
    rows = await _relay_all(epool)
    # then every event has the next position, in its body and in the history
    assert [r.seq for r in rows] == [1, 2]
    assert [json.loads(r.body)["seq"] for r in rows] == [1, 2]
    async with epool.acquire() as conn:
        logged = await event_log.after(conn, 0, ALL, 100)
        assert [(e.seq, e.routing_key) for e in logged] == [
            (1, "task.on_cpu.j-1"),
            (2, "job.succeeded.j-1"),
        ]
        assert json.loads(logged[0].body) == json.loads(rows[0].body)
        assert (await event_log.bounds(conn)).last_given == 2


async def test_a_row_read_again_after_a_failed_publish_keeps_its_position(epool: db.Pool) -> None:
    # given a batch read (numbered) whose publish failed: not marked
    await _write(epool, _event(), _event())
    async with epool.acquire() as conn:
        first = await outbox.pending(conn, 10)
        # when another event comes and the relay reads again
        await _write(epool, _event())
        again = await outbox.pending(conn, 10)
    # then the two keep their positions and the new one gets the next
    assert [r.seq for r in first] == [1, 2]
    assert [r.seq for r in again] == [1, 2, 3]
    async with epool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM events") == 3


async def test_readers_see_positions_without_gaps_while_writers_and_two_relays_race(
    epool: db.Pool,
) -> None:
    """Writers commit in any order, two relays (two leaders for a moment) number at once, and
    readers follow the history: every read continues exactly where the last one ended."""
    writers_done = asyncio.Event()
    total = 300

    async def writer(n: int) -> None:
        for _ in range(total // 6):
            await _write(epool, _event(job=f"j-{n}"))

    async def relay() -> None:
        mark: list[int] = []
        async with epool.acquire() as conn:
            while True:
                last_round = writers_done.is_set()  # looked at before the read
                rows = await outbox.pending(conn, 5, confirmed=mark)
                mark = [r.id for r in rows]
                if not rows:
                    if last_round:
                        return
                    await asyncio.sleep(0.001)

    async def reader() -> list[int]:
        seen: list[int] = []
        async with epool.acquire() as conn:
            while len(seen) < total:
                got = [e.seq for e in await event_log.after(conn, seen[-1] if seen else 0, ALL, 17)]
                assert got == list(range(len(seen) + 1, len(seen) + 1 + len(got))), (seen[-3:], got)
                seen += got
                await asyncio.sleep(0)
        return seen

    async def writers() -> None:
        await asyncio.gather(*(writer(n) for n in range(6)))
        writers_done.set()

    async with asyncio.timeout(60):
        results = await asyncio.gather(writers(), relay(), relay(), reader(), reader())
    assert results[3] == results[4] == list(range(1, total + 1))
    async with epool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM events") == total
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 0  # all went, each once


async def test_a_read_by_topics_gives_only_matching_events(epool: db.Pool) -> None:
    # given
    await _write(
        epool,
        _event("j-a", TaskState.ON_CPU),
        _event("j-b", TaskState.ON_CPU),
        _event("j-a", TaskState.COMPLETED),
        JobEvent(job_id="j-a", outcome=JobOutcome.SUCCEEDED),
    )
    await _relay_all(epool)
    async with epool.acquire() as conn:

        async def keys(*patterns: str, after: int = 0) -> list[str]:
            wanted = topics.parse_all(list(patterns))
            return [e.routing_key for e in await event_log.after(conn, after, wanted, 100)]

        # then
        assert await keys("task.*.j-a") == ["task.on_cpu.j-a", "task.completed.j-a"]
        assert await keys("task.on_cpu.*") == ["task.on_cpu.j-a", "task.on_cpu.j-b"]
        assert await keys("job.*.#", "task.completed.j-a") == [
            "task.completed.j-a",
            "job.succeeded.j-a",
        ]
        assert await keys("task.*.j-a", after=1) == ["task.completed.j-a"]
        assert await keys("log.*.j-a") == []  # log lines have no positions


async def test_a_jobs_history_pages_oldest_or_newest_first(epool: db.Pool) -> None:
    # given
    await _write(epool, *(_event("j-a") for _ in range(5)), _event("j-b"))
    await _relay_all(epool)
    async with epool.acquire() as conn:
        # when / then
        oldest = await event_log.of_job(conn, "j-a", order="oldest", start=None, limit=2)
        assert [e.seq for e in oldest] == [1, 2]
        rest = await event_log.of_job(conn, "j-a", order="oldest", start=2, limit=10)
        assert [e.seq for e in rest] == [3, 4, 5]
        newest = await event_log.of_job(conn, "j-a", order="newest", start=None, limit=2)
        assert [e.seq for e in newest] == [5, 4]
        older = await event_log.of_job(conn, "j-a", order="newest", start=4, limit=10)
        assert [e.seq for e in older] == [3, 2, 1]


async def test_retention_removes_old_events_in_batches_and_says_what_is_lost(
    epool: db.Pool,
) -> None:
    # given five events numbered long ago and one just now
    await _write(epool, *(_event() for _ in range(5)))
    await _relay_all(epool)
    async with epool.acquire() as conn:
        await conn.execute("UPDATE events SET numbered_at = now() - interval '8 days'")
    await _write(epool, _event())
    await _relay_all(epool)
    async with epool.acquire() as conn:
        # when
        went = [await event_log.prune(conn, 7 * 86400, batch=2) for _ in range(4)]
        # then
        assert went == [2, 2, 1, 0]
        assert [e.seq for e in await event_log.after(conn, 0, ALL, 100)] == [6]
        bounds = await event_log.bounds(conn)
        assert (bounds.pruned_through, bounds.last_given, bounds.oldest_retained) == (5, 6, 6)
        assert bounds.lost(4)
        assert not bounds.lost(5)
