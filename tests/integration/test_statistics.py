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
        await conn.execute("ANALYZE task_prerequisites")  # as at a first look: empty
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


async def test_tasks_are_analysed_once_the_tasks_claimed_double_though_the_table_does_not(
    young_database_url: str,
) -> None:
    """A table of ended tasks does not grow while a pool fills up, but the feed's plans depend
    on how many tasks are claimed."""
    async with db.open_pool(young_database_url, max_size=1) as pool, pool.acquire() as conn:
        # given tasks analysed while none was claimed
        await conn.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE task_prerequisites")  # as at a first look: empty
        await _add_jobs(conn, 1, 1)
        await conn.execute(
            "INSERT INTO tasks (id, job_id, index, input, state)"
            " SELECT 't-' || g, 'j-1', g, to_jsonb(g), 'new' FROM generate_series(1, 1200) g"
        )
        await conn.execute("SELECT pg_stat_force_next_flush()")
        assert await statistics.analyse_due(conn) == ["tasks"]
        # when fewer than FIRST_ROWS are claimed, then 600, then 1,100 (under twice 600)
        few = await statistics.analyse_due(conn, claimed=statistics.FIRST_ROWS - 1)
        await conn.execute("UPDATE tasks SET claim = gen_random_uuid() WHERE index <= 600")
        grown = await statistics.analyse_due(conn, claimed=600)
        steady = await statistics.analyse_due(conn, claimed=1100)
        # then only the growth past its last analysis's claimed share, and FIRST_ROWS, is due
        assert (few, grown, steady) == ([], ["tasks"], [])
        await conn.execute("SELECT pg_stat_force_next_flush()")
        assert await _analysed(conn, "tasks") == 2


async def test_the_prerequisites_are_analysed_once_while_empty_and_again_once_they_hold_rows(
    young_database_url: str,
) -> None:
    """A table never analysed is planned as ten pages of rows: the waiters' statement drove
    from the waiting tasks and probed the empty prerequisites once for each."""
    async with db.open_pool(young_database_url, max_size=1) as pool, pool.acquire() as conn:
        # given no prerequisite at all, the table never analysed
        await conn.execute("ALTER TABLE task_prerequisites SET (autovacuum_enabled = false)")
        # when the scheduler looks twice, then after a job's first prerequisites
        first = await statistics.analyse_due(conn)
        again = await statistics.analyse_due(conn)
        await _add_jobs(conn, 1, 1)
        await conn.execute(
            "INSERT INTO tasks (id, job_id, index, input) SELECT 't-' || g, 'j-1', g, 'null'"
            " FROM generate_series(1, 3) g"
        )
        await conn.execute(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " VALUES ('t-2', 'setup', 't-1', 'completed'), ('t-3', 'setup', 't-1', 'completed')"
        )
        await conn.execute("SELECT pg_stat_force_next_flush()")
        grown = await statistics.analyse_due(conn)
    # then the empty table was analysed once, and again once it held rows
    assert "task_prerequisites" in first
    assert "task_prerequisites" not in again
    assert "task_prerequisites" in grown


async def test_the_hosts_are_analysed_from_their_tenth_row(young_database_url: str) -> None:
    """Every round reads all the hosts: a plan made while a pool's hosts were registering
    expects one and joins each host to the load of the tasks in flight again."""

    async def register(first: int, last: int) -> None:
        await conn.execute(
            "INSERT INTO hosts (id, slots, worker) SELECT 'h-' || g, 16, 'w-' || g"
            " FROM generate_series($1::int, $2) g",
            first,
            last,
        )
        await conn.execute("SELECT pg_stat_force_next_flush()")

    async with db.open_pool(young_database_url, max_size=1) as pool, pool.acquire() as conn:
        # given hosts kept from autovacuum, fewer than the first analysis's size
        await conn.execute("ALTER TABLE hosts SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE task_prerequisites")  # as at a first look: empty
        await register(1, statistics.FIRST_HOSTS - 1)
        few = await statistics.analyse_due(conn)
        # when they reach it, then double
        await register(statistics.FIRST_HOSTS, statistics.FIRST_HOSTS)
        first = await statistics.analyse_due(conn)
        await register(statistics.FIRST_HOSTS + 1, 2 * statistics.FIRST_HOSTS + 1)
        doubled = await statistics.analyse_due(conn)
        # then they were analysed at the first size and as they doubled
        assert (few, first, doubled) == ([], ["hosts"], ["hosts"])
