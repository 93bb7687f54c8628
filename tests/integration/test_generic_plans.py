"""Statements on the task path keep one plan per connection (`db.GENERIC_PLANS`).

PostgreSQL plans a prepared statement anew at each of its first five calls, and at every later
call while it judges that the parameters may change the plan: under W1 the submission's release
statement was planned at every other call (1.4 ms of planning for 0.4 ms of work). The worker's
pool, the submission's transaction and the scheduler's round ask for generic plans; the counts
are PostgreSQL's own (`pg_prepared_statements`, per connection: each test reads every
connection of its pool).
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.scheduler.dispatcher import Dispatcher
from shared.store import db
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration

#: A lookup by key, as the worker makes them.
_LOOKUP = "SELECT count(*) FROM jobs WHERE id = $1"


@dataclass(frozen=True)
class Plans:
    generic: int
    custom: int


async def _plans(pool: db.Pool, statement_part: str) -> Plans:
    """How many generic and custom plans the pool's connections made for the statements that
    hold `statement_part` (every connection borrowed at once, so that each is counted)."""
    conns = [await pool.acquire() for _ in range(pool.get_max_size())]
    try:
        generic = custom = 0
        for conn in conns:
            row = await conn.fetchrow(
                "SELECT coalesce(sum(generic_plans), 0) AS generic,"
                " coalesce(sum(custom_plans), 0) AS custom"
                " FROM pg_prepared_statements WHERE strpos(statement, $1) > 0",
                statement_part,
            )
            assert row is not None
            generic, custom = generic + row["generic"], custom + row["custom"]
        return Plans(generic, custom)
    finally:
        for conn in conns:
            await pool.release(conn)


@pytest.mark.parametrize("generic_plans", [True, False])
async def test_a_pool_for_generic_plans_plans_each_statement_once(
    session_database_url: str, generic_plans: bool
) -> None:
    async with db.open_pool(session_database_url, max_size=1, generic_plans=generic_plans) as pool:
        for i in range(8):
            await pool.fetchval(_LOOKUP, f"j-{i}")
        plans = await _plans(pool, _LOOKUP)

    if generic_plans:
        assert plans == Plans(generic=8, custom=0)
    else:  # the default: the first five calls are planned each
        assert plans.custom >= 5


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as api:
        yield api


async def test_a_submission_plans_its_insert_once_per_connection(api: Api) -> None:
    for _ in range(8):
        await api.submit(api.user, command="true", inputs=["a"])

    made = await _plans(api.pool, "WITH job AS (INSERT INTO jobs")
    assert made.custom == 0 and made.generic >= 8


async def test_the_scheduler_plans_its_round_once_per_connection(session_database_url: str) -> None:
    async with db.open_pool(session_database_url, max_size=1) as pool:
        dispatcher = Dispatcher(pool, batch=10, worker_pool="default")
        for _ in range(8):
            await dispatcher.run_once()
        resting = await _plans(pool, "picked AS (")
        feed = await _plans(pool, "CROSS JOIN LATERAL (\n    SELECT count(*) AS n")

    assert resting == Plans(generic=8, custom=0)
    assert feed == Plans(generic=8, custom=0)
