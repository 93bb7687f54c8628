"""The scheduler analysing Vigil's tables as they grow, whether autovacuum runs or not (real
PostgreSQL)."""

from collections.abc import Iterator

import pytest

from services.scheduler import statistics
from shared.store import db, users_repo
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration


@pytest.fixture
def young_database_url() -> Iterator[str]:
    """A migrated database of this test's own, its tables empty."""
    with fresh_database("vigil_statistics") as url:
        yield url


async def _add_jobs(conn: db.Connection, first: int, last: int) -> None:
    owner = await users_repo.ensure_user(conn, "u-stats", "user", "x")
    await conn.execute(
        "INSERT INTO jobs (id, owner_id, name, type, command)"
        " SELECT 'j-' || g, $3, 'n', 'shell', 'true' FROM generate_series($1::int, $2) g",
        first,
        last,
        owner.id,
    )
    await conn.execute("SELECT pg_stat_force_next_flush()")  # the counts are seen at once


async def _analysed(conn: db.Connection, table: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = $1", table
        )
    )


async def test_a_table_is_analysed_as_it_doubles_and_not_in_between(
    young_database_url: str,
) -> None:
    """The scheduler does not wait for autovacuum, where it runs (its next look comes up to a
    minute later). Autovacuum is kept off this table here, so that it cannot analyse it
    between the steps of the test."""
    async with db.open_pool(young_database_url, max_size=1) as pool, pool.acquire() as conn:
        # given a table, under its first analysis's size
        await conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        await _add_jobs(conn, 1, statistics.FIRST_ROWS - 1)
        assert await statistics.analyse_due(conn) == []
        # when it reaches that size, then grows by less than double, then doubles
        await _add_jobs(conn, statistics.FIRST_ROWS, 600)
        first = await statistics.analyse_due(conn)
        await _add_jobs(conn, 601, 1200)
        between = await statistics.analyse_due(conn)
        await _add_jobs(conn, 1201, 1201)
        doubled = await statistics.analyse_due(conn)
        await conn.execute("SELECT pg_stat_force_next_flush()")
        # then it was analysed each time it was due, and only then
        assert (first, between, doubled) == (["jobs"], [], ["jobs"])
        assert await _analysed(conn, "jobs") == 2
