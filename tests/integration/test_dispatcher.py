"""The dispatcher on the real PostgreSQL: what it releases (see also the e2e tests)."""

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from services.scheduler.dispatcher import Dispatcher
from shared.domain.messages import RunStage, to_jsonable
from shared.domain.states import Stage
from shared.operations import configuring, emergency
from shared.operations.configuring import TrialInput
from shared.store import db, jobs_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration


async def _submitted(conn: Connection, new: NewJob) -> jobs_repo.Job:
    """Given-step: `new`, submitted by a fresh user."""
    user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
    job, _ = await jobs_repo.create(conn, user.id, new)
    return job


async def test_a_configuring_jobs_test_task_waits_out_an_emergency_stop(pool: Pool) -> None:
    dispatcher = Dispatcher(pool, batch=10_000, worker_pool="default")
    async with pool.acquire() as conn:
        # given a test task of a configuring job, and an emergency stop in force
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        new = NewJob("trial", "shell", "true", ["a"], configuring=True)
        job, _ = await jobs_repo.create(conn, user.id, new)
        test = await configuring.start_test(conn, job.id, TrialInput())
        await emergency.stop(conn, "op", "dispatcher test")
        try:
            # when the dispatcher runs, the test task is not released
            await dispatcher.run_once()
            held = await conn.fetchval("SELECT claim FROM tasks WHERE id = $1", test.id)
        finally:
            await emergency.resume(conn, "op")

        # then once the stop is lifted it is
        await dispatcher.run_once()
        released = await conn.fetchval("SELECT claim FROM tasks WHERE id = $1", test.id)
    assert held is None
    assert released is not None


async def test_a_job_throttled_at_submission_never_has_more_in_flight_from_its_first_release(
    pool: Pool,
) -> None:
    dispatcher = Dispatcher(pool, batch=10_000, worker_pool="default")
    async with pool.acquire() as conn:
        new = NewJob("licensed", "shell", "true", list("abcdef"), max_in_flight=2)
        job = await _submitted(conn, new)
        assert (job.max_in_flight, job.release_per_tick) == (2, 1000)

        in_flight = []
        for _ in range(3):  # rounds with nothing finishing in between
            await dispatcher.run_once()
            in_flight.append(
                await conn.fetchval(
                    "SELECT count(*) FROM tasks WHERE job_id = $1 AND claim IS NOT NULL", job.id
                )
            )

    assert in_flight == [2, 2, 2]


async def test_the_work_messages_made_in_sql_read_as_run_stage_would_have_written_them(
    pool: Pool,
) -> None:
    dispatcher = Dispatcher(pool, batch=10_000, worker_pool="default")
    async with pool.acquire() as conn:
        job = await _submitted(conn, NewJob("made", "shell", "true", ["a", "b"]))

        assert (await dispatcher.run_once()).released >= 2
        rows = await conn.fetch(
            "SELECT routing_key, body FROM outbox WHERE exchange = 'work'"
            " AND body->>'job_id' = $1 ORDER BY id",
            job.id,
        )
        tasks = await conn.fetch("SELECT id, claim FROM tasks WHERE job_id = $1", job.id)
        claims = {r["id"]: r["claim"] for r in tasks}

    messages = [RunStage.model_validate(r["body"]) for r in rows]
    assert [r["routing_key"] for r in rows] == ["pool.default"] * 2
    model = to_jsonable(RunStage(job_id=job.id, task_id="t", stage=Stage.SETUP, claim=uuid.uuid4()))
    for row, message in zip(rows, messages, strict=True):
        assert set(row["body"]) == set(model)  # the same fields, no more, no fewer
        assert message.stage is Stage.SETUP
        assert message.claim == claims[message.task_id]
    assert sorted(m.task_id for m in messages) == sorted(claims)


@pytest.fixture(scope="module")
def share_database_url() -> Iterator[str]:
    with fresh_database("vigil_fair_share") as url:
        yield url


async def _released_per_owner(conn: Connection, owners: dict[str, str]) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT j.owner_id, count(*) AS n FROM tasks t JOIN jobs j ON j.id = t.job_id"
        " WHERE t.claim IS NOT NULL GROUP BY j.owner_id"
    )
    by_id = {r["owner_id"]: int(r["n"]) for r in rows}
    return {name: by_id.get(user_id, 0) for name, user_id in owners.items()}


@pytest.mark.parametrize(
    ("batch", "per_user", "expected"),
    [
        (4, None, {"early": 2, "late": 2}),  # one round: users interleaved, not first come
        (100, 3, {"early": 3, "late": 3}),  # the cap, over both of early's jobs
    ],
)
async def test_users_share_the_releases_and_each_stays_within_the_per_user_cap(
    share_database_url: str, batch: int, per_user: int | None, expected: dict[str, int]
) -> None:
    async with db.open_pool(share_database_url, max_size=2) as pool, pool.acquire() as conn:
        await conn.execute("UPDATE tasks SET claim = NULL, state = 'completed'")  # a clean slate
        # given a user with two big jobs submitted first, and another with one job after
        owners = {}
        for name, jobs in (("early", 2), ("late", 1)):
            user = await users_repo.ensure_user(conn, f"{name}-{uuid.uuid4().hex[:8]}", "user", "x")
            owners[name] = user.id
            for _ in range(jobs):
                await jobs_repo.create(
                    conn, user.id, NewJob(name, "shell", "true", list("abcdefgh"))
                )

        # when the dispatcher runs twice (nothing ends in between)
        dispatcher = Dispatcher(pool, batch=batch, worker_pool="default", per_user=per_user)
        await dispatcher.run_once()
        if per_user is not None:
            await dispatcher.run_once()

        # then each user got their share
        assert await _released_per_owner(conn, owners) == expected


@pytest.fixture(scope="module")
def waiting_database_url() -> Iterator[str]:
    with fresh_database("vigil_waiting") as url:
        yield url


@pytest.fixture
async def quiet_pool(waiting_database_url: str) -> AsyncIterator[Pool]:
    """A database of its own where nothing waits to be released at first."""
    async with db.open_pool(waiting_database_url, max_size=2) as pool:
        await pool.execute("UPDATE tasks SET claim = NULL, state = 'completed'")
        yield pool


async def _waiting_after(pool: Pool, *rounds: int) -> list[bool]:
    """The dispatcher's `waiting` over as many rounds as given (nothing ends in between)."""
    dispatcher = Dispatcher(pool, batch=10_000, worker_pool="default")
    return [(await dispatcher.run_once()).waiting for _ in rounds]


async def test_with_nothing_unclaimed__no_task_waits(quiet_pool: Pool) -> None:
    assert await _waiting_after(quiet_pool, 1) == [False]


async def test_a_release_says_tasks_were_waiting_and_the_next_round_that_none_are(
    quiet_pool: Pool,
) -> None:
    async with quiet_pool.acquire() as conn:
        await _submitted(conn, NewJob("all", "shell", "true", ["a", "b"]))
    assert await _waiting_after(quiet_pool, 1, 2) == [True, False]


async def test_tasks_a_throttle_holds_back_keep_waiting(quiet_pool: Pool) -> None:
    async with quiet_pool.acquire() as conn:
        await _submitted(conn, NewJob("held", "shell", "true", list("abc"), max_in_flight=1))
    assert await _waiting_after(quiet_pool, 1, 2) == [True, True]


async def test_a_task_waiting_on_a_prerequisite_keeps_waiting(quiet_pool: Pool) -> None:
    async with quiet_pool.acquire() as conn:
        first = await _submitted(conn, NewJob("first", "shell", "true", ["a"]))
        upstream = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", first.id)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("later", "shell", "true", ["b"]))
        task_id = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", job.id)
        await conn.execute(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " VALUES ($1, 'setup', $2, 'completed')",
            task_id,
            upstream,
        )
    assert await _waiting_after(quiet_pool, 1, 2) == [True, True]


async def test_a_suspended_jobs_tasks_do_not_wait_to_be_released(quiet_pool: Pool) -> None:
    async with quiet_pool.acquire() as conn:
        job = await _submitted(conn, NewJob("paused", "shell", "true", ["a"]))
        await conn.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", job.id)
    assert await _waiting_after(quiet_pool, 1) == [False]
