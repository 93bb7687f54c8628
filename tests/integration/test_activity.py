"""The charts' per-minute counts in PostgreSQL (`shared.store.activity`): written in one statement,
added to on a second write of the same minute, kept in memory when the write fails."""

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from shared.store import activity, db

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


async def test_counts_are_written_per_minute_and_added_to(pool: db.Pool) -> None:
    job = f"j-{uuid.uuid4().hex[:10]}"
    tally = activity.Tally()
    tally.count(f"task.on_cpu.{job}", b"{}", T0 + timedelta(seconds=1))
    tally.count(f"task.on_cpu.{job}", b"{}", T0 + timedelta(seconds=2))

    async with pool.acquire() as conn:
        assert await tally.flush(conn) == 2  # the job's row and the system's
        tally.count(f"task.on_cpu.{job}", b"{}", T0 + timedelta(seconds=30))
        await tally.flush(conn)
        rows = await activity.since(conn, job, T0)

    assert rows == [(T0, "state:on_cpu", 3)]
    assert not tally.counts


async def test_counts_a_failed_write_could_not_store_are_kept_for_the_next(
    pool: db.Pool, session_database_url: str
) -> None:
    job = f"j-{uuid.uuid4().hex[:10]}"
    tally = activity.Tally()
    tally.count(f"task.completed.{job}", b"{}", T0)
    gone = await asyncpg.connect(session_database_url)
    await gone.close()

    with pytest.raises(asyncpg.InterfaceError):
        await tally.flush(gone)
    async with pool.acquire() as conn:
        await tally.flush(conn)
        rows = await activity.since(conn, job, T0)

    assert rows == [(T0, "state:completed", 1)]


async def test_old_minutes_are_pruned(pool: db.Pool) -> None:
    job = f"j-{uuid.uuid4().hex[:10]}"
    tally = activity.Tally()
    tally.count(f"task.completed.{job}", b"{}", datetime.now(UTC) - timedelta(days=3))
    tally.count(f"task.completed.{job}", b"{}", datetime.now(UTC))
    async with pool.acquire() as conn:
        await tally.flush(conn)
        await activity.prune(conn, older_than_s=86_400)
        rows = await activity.since(conn, job, datetime.now(UTC) - timedelta(days=7))

    assert [kind for _, kind, _ in rows] == ["state:completed"]
    assert rows[0][0] > datetime.now(UTC) - timedelta(minutes=2)
