"""The dispatcher on the real PostgreSQL: what it releases (see also the e2e tests)."""

import uuid

import pytest

from services.scheduler.dispatcher import Dispatcher
from shared import configuring, emergency, jobs_repo, users_repo
from shared.configuring import TrialInput
from shared.db import Pool
from shared.jobs_repo import NewJob

pytestmark = pytest.mark.integration


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
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        new = NewJob("licensed", "shell", "true", list("abcdef"), max_in_flight=2)
        job, _ = await jobs_repo.create(conn, user.id, new)
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
