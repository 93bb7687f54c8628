"""The finaliser against concurrent additions of work (real PostgreSQL and Redis)."""

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from services.scheduler import finaliser as finaliser_module
from services.scheduler.finaliser import Finaliser
from shared.domain.actions import JobAction
from shared.domain.messages import JobEvent, to_jsonable
from shared.domain.states import JobState, TaskState, job_outcome
from shared.messaging.redis_keys import RedisKeys
from shared.operations import datasets, task_actions
from shared.store import db, jobs_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.conftest import REDIS_URL, fresh_database

pytestmark = pytest.mark.integration


async def test_when_a_task_is_added_while_the_job_is_being_finalised__the_job_stays_active(
    pool: Pool, namespace: str
) -> None:
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    finaliser = Finaliser(pool, redis, RedisKeys(namespace), batch=10_000)
    try:
        async with pool.acquire() as adder, pool.acquire() as conn:
            # given a job whose only task failed for good
            user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
            job, _ = await jobs_repo.create(conn, user.id, NewJob("f", "shell", "true", ["a"]))
            [task_id] = await datasets.task_ids_of(conn, job.id)
            await conn.execute(
                "UPDATE tasks SET state = 'failed_on_cluster' WHERE id = $1", task_id
            )

            # when a duplicate is being added (its transaction holds the job row) while the
            # finaliser sweeps (its first round)
            async with adder.transaction():
                await jobs_repo.add_tasks(adder, job.id, ["b"], 1)
                await task_actions.reopen_job(adder, job.id)
                await finaliser.run_once()
                # then it passes the job by, to be looked at again
                passed_by = finaliser.pending
                assert passed_by
                assert (await jobs_repo.get(conn, job.id)).state.value == "active"  # type: ignore[union-attr]

            # and, looking again with the new task committed, it leaves the job active
            assert await finaliser.run_once() == 0
            assert not finaliser.pending
            assert (await jobs_repo.get(conn, job.id)).state.value == "active"  # type: ignore[union-attr]
    finally:
        await redis.aclose()


async def test_when_a_job_is_cancelled__its_redis_keys_are_purged(
    pool: Pool, namespace: str, redis: Redis
) -> None:
    keys = RedisKeys(namespace)
    finaliser = Finaliser(pool, redis, keys, batch=10_000, purge_every_s=0)
    async with pool.acquire() as conn:
        # a job cancelled before a sweep (found by its finished_at), and one between two
        # rounds that the relay tells of (its job.cancelled was published)
        first = await _cancelled_job_with_keys(conn, redis, keys)
        await finaliser.run_once()
        second = await _cancelled_job_with_keys(conn, redis, keys)
        finaliser.cancelled(second)
        await finaliser.run_once()

    assert [await redis.exists(keys.job_exits(j)) for j in (first, second)] == [0, 0]


async def _cancelled_job_with_keys(conn: Connection, redis: Redis, keys: RedisKeys) -> str:
    user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
    job, _ = await jobs_repo.create(conn, user.id, NewJob("c", "shell", "true", ["a"]))
    await redis.hset(keys.job_exits(job.id), "t", "0")
    await task_actions.apply_to_job(conn, job.id, JobAction.CANCEL, "op")
    return job.id


async def _just_purged(
    pool: Pool, redis: Redis, keys: RedisKeys, *, purge_every_s: float
) -> Finaliser:
    """A finaliser after its first round, which purged (the first purge is due at once)."""
    finaliser = Finaliser(pool, redis, keys, batch=10_000, purge_every_s=purge_every_s)
    await finaliser.run_once()
    return finaliser


async def test_the_keys_of_a_job_ended_soon_after_a_purge_wait_for_the_next(
    pool: Pool, namespace: str, redis: Redis
) -> None:
    # given a finaliser that purges at most every hour, and has just purged
    keys = RedisKeys(namespace)
    finaliser = await _just_purged(pool, redis, keys, purge_every_s=3600)
    # when a job is cancelled and the next round runs
    async with pool.acquire() as conn:
        job_id = await _cancelled_job_with_keys(conn, redis, keys)
    finaliser.cancelled(job_id)
    await finaliser.run_once()
    # then its keys are still there: no round trip to Redis for them yet
    assert await redis.exists(keys.job_exits(job_id)) == 1


async def test_the_keys_of_jobs_ended_between_two_purges_go_at_the_next(
    pool: Pool, namespace: str, redis: Redis
) -> None:
    keys = RedisKeys(namespace)
    finaliser = await _just_purged(pool, redis, keys, purge_every_s=0.05)
    async with pool.acquire() as conn:
        job_ids = [await _cancelled_job_with_keys(conn, redis, keys) for _ in range(2)]
    for job_id in job_ids:
        finaliser.cancelled(job_id)
        await finaliser.run_once()
    # whatever the rounds' timing, the rounds after the gap purge every key held back
    async with asyncio.timeout(10):
        while any([await redis.exists(keys.job_exits(j)) for j in job_ids]):
            await finaliser.run_once()


async def test_the_jobs_a_task_ended_in_are_ended_together_and_a_held_one_is_skipped(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn, pool.acquire() as holder:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        jobs = {}
        for name, state in (
            ("done", "completed"),
            ("failed", "failed_on_cluster"),
            ("running", "on_cpu"),
            ("held", "completed"),
        ):
            job, _ = await jobs_repo.create(conn, user.id, NewJob(name, "shell", "true", ["a"]))
            await conn.execute("UPDATE tasks SET state = $2 WHERE job_id = $1", job.id, state)
            jobs[name] = job.id

        async with holder.transaction():  # someone adding work holds this job's row
            await holder.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", jobs["held"])
            ended, skipped = await jobs_repo.end_finished(conn, sorted(jobs.values()))

        assert ended == {jobs["done"]: JobState.COMPLETED, jobs["failed"]: JobState.FAILED}
        assert skipped == {jobs["held"]}
        events = await conn.fetch(
            "SELECT routing_key FROM outbox WHERE routing_key LIKE 'job.%' AND body->>'job_id'"
            " = ANY($1) ORDER BY id",
            sorted(jobs.values()),
        )
        assert sorted(r["routing_key"] for r in events) == sorted(
            [f"job.succeeded.{jobs['done']}", f"job.failed.{jobs['failed']}"]
        )
        running = await jobs_repo.get(conn, jobs["running"])
        assert running is not None and running.state is JobState.ACTIVE


async def _job_with_tasks(conn: Connection, states: list[str], **columns: Any) -> str:
    """A job with one task per state in `states` (extra task columns as given)."""
    user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
    job, _ = await jobs_repo.create(
        conn, user.id, NewJob("o", "shell", "true", [str(n) for n in range(len(states))])
    )
    for task_id, state in zip(await datasets.task_ids_of(conn, job.id), states, strict=True):
        await conn.execute("UPDATE tasks SET state = $2 WHERE id = $1", task_id, state)
    for column, value in columns.items():
        await conn.execute(f"UPDATE tasks SET {column} = $2 WHERE job_id = $1", job.id, value)
    return job.id


@pytest.mark.parametrize(
    "states",
    [
        ["completed"],
        ["completed", "completed"],
        ["completed", "failed_on_cluster"],
        ["terminated"],
        ["completed", "failed_setup_prerequisites"],
    ],
)
async def test_a_jobs_end_is_the_outcome_the_domain_gives_its_tasks(
    pool: Pool, states: list[str]
) -> None:
    async with pool.acquire() as conn:
        job_id = await _job_with_tasks(conn, states)
        ended, _ = await jobs_repo.end_finished(conn, [job_id])
    expected = job_outcome(Counter(TaskState(s) for s in states))
    assert ended == {job_id: expected}


async def test_a_task_superseded_by_its_clone_does_not_decide_and_test_tasks_do_not_count(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given: a failed task resubmitted as a clone that completed
        job_id = await _job_with_tasks(conn, ["failed_on_cluster", "completed"])
        failed, clone = await datasets.task_ids_of(conn, job_id)
        await conn.execute("UPDATE tasks SET superseded_by = $2 WHERE id = $1", failed, clone)
        # and a job whose only tasks are test tasks
        only_tests = await _job_with_tasks(conn, ["completed"], test=True)
        ended, _ = await jobs_repo.end_finished(conn, [job_id, only_tests])
    assert ended == {job_id: JobState.COMPLETED}


async def test_the_end_event_made_in_sql_reads_as_the_model_would_have_written_it(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _job_with_tasks(conn, ["failed_on_cluster"])
        await jobs_repo.end_finished(conn, [job_id])
        row = await conn.fetchrow(
            "SELECT routing_key, body FROM outbox WHERE routing_key LIKE 'job.%' AND"
            " body->>'job_id' = $1",
            job_id,
        )
    assert row is not None
    event = JobEvent.model_validate(row["body"])
    written = jobs_repo.outcome_event(job_id, JobState.FAILED)
    assert row["routing_key"] == f"job.failed.{job_id}"
    assert set(row["body"]) == set(to_jsonable(written))  # the same fields, no more
    assert event == written.model_copy(
        update={"message_id": event.message_id, "sent_at": event.sent_at}
    )


@pytest.fixture
def young_database_url() -> Iterator[str]:
    """A migrated database of this test's own, its tables empty."""
    with fresh_database("vigil_young") as url:
        yield url


async def test_plans_the_finaliser_made_on_young_tables_still_probe_once_they_have_grown(
    young_database_url: str,
) -> None:
    async with db.open_pool(young_database_url, max_size=1) as pool, pool.acquire() as conn:
        # given the finaliser's plans made while the tables were empty (kept by the connection)
        for _ in range(6):
            assert await conn.fetch("SELECT * FROM end_finished_jobs($1::text[])", ["j-0"]) == []
        # and, never analysed since, thousands of active jobs, each with a task that completed
        user = await users_repo.ensure_user(conn, "u-young", "user", "x")
        await conn.execute(
            "INSERT INTO jobs (id, owner_id, name, type, command)"
            " SELECT 'j-' || g, $1, 'n', 'shell', 'true' FROM generate_series(1, 3000) g",
            user.id,
        )
        await conn.execute(
            "INSERT INTO tasks (id, job_id, index, state, decided, input)"
            " SELECT 't-' || g, 'j-' || g, 0, 'completed', true, '{}'"
            " FROM generate_series(1, 3000) g"
        )
        # when the finaliser ends one of them, each of its statements' plans told to us
        plans: list[str] = []

        def told_plan(_conn: object, message: object) -> None:
            plans.append(str(message))

        conn.add_log_listener(told_plan)
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_level = notice",
        ):
            await conn.execute(setting)
        ended = await conn.fetch("SELECT * FROM end_finished_jobs($1::text[])", ["j-5"])
        await conn.execute("LOAD 'auto_explain'")  # any notice sent before is read by now
        conn.remove_log_listener(told_plan)
    # then it ended that job, reading neither every task nor every active job to do so
    assert [tuple(row) for row in ended] == [("j-5", "completed", False)]
    told = "\n".join(plans)
    assert "Seq Scan" not in told
    assert "jobs_active" not in told
    assert "tasks_unfinished" in told  # the plans were told: its tasks were probed


async def test_a_job_found_unfinished_is_looked_at_again_only_once_its_relook_is_due(
    pool: Pool, namespace: str
) -> None:
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    waits = Finaliser(pool, redis, RedisKeys(namespace), batch=10_000, relook_after_s=3600)
    at_once = Finaliser(pool, redis, RedisKeys(namespace), batch=10_000, relook_after_s=0)
    try:
        async with pool.acquire() as conn:
            # given two jobs of two tasks, one ended and one running each, told of and found
            # unfinished (after each finaliser's first round, a sweep)
            jobs = [await _job_with_tasks(conn, ["completed", "on_cpu"]) for _ in range(2)]
            for finaliser, job_id in zip((waits, at_once), jobs, strict=True):
                await finaliser.run_once()
                finaliser.touch(job_id)
                assert await finaliser.run_once() == 0

            # when their last tasks end, and each finaliser is told of its job again
            for finaliser, job_id in zip((waits, at_once), jobs, strict=True):
                await conn.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", job_id)
                finaliser.touch(job_id)
                await finaliser.run_once()

            # then the one looked at lately waits for its relook, said when, and not pending
            states = [(await jobs_repo.get(conn, job_id)).state for job_id in jobs]  # type: ignore[union-attr]
            assert states == [JobState.ACTIVE, JobState.COMPLETED]
            at = waits.next_look()
            assert at is not None and at > time.monotonic() + 3000 and not waits.pending
            assert at_once.next_look() is None
    finally:
        await redis.aclose()


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


async def _swept(pool: Pool, redis: Redis, namespace: str, **settings: float) -> Finaliser:
    """A finaliser after its first round (a sweep: none follows within a test)."""
    finaliser = Finaliser(
        pool, redis, RedisKeys(namespace), batch=10_000, sweep_every_s=3600, **settings
    )
    await finaliser.run_once()
    return finaliser


async def test_a_job_seen_with_a_task_to_place_is_looked_at_once_a_read_no_longer_sees_it(
    pool: Pool, redis: Redis, namespace: str
) -> None:
    finaliser = await _swept(pool, redis, namespace, waiting_hold_s=3600)
    swept = finaliser.looks
    async with pool.acquire() as conn:
        # given a job told of, then seen with a task to place by a read begun after that
        # (made up here: its tasks have all ended, so that a look ends it)
        job_id = await _job_with_tasks(conn, ["completed"])
        finaliser.touch(job_id)
        finaliser.unfinished([job_id], time.monotonic())
        # then the finaliser leaves it alone: what it was told of had not finished it
        assert await finaliser.run_once() == 0
        assert (finaliser.looks - swept, finaliser.spared) == (0, 1)

        # when it is told of again, after a read that saw it so began
        read_from = time.monotonic()
        finaliser.touch(job_id)
        finaliser.unfinished([job_id], read_from)
        # then its look waits for the next read, and says how long at most
        assert await finaliser.run_once() == 0
        assert (finaliser.looks - swept, finaliser.spared, finaliser.pending) == (0, 1, False)
        assert finaliser.next_look() == read_from + 3600

        # when the next read does not see it, the finaliser looks and ends it
        finaliser.unfinished([], time.monotonic())
        assert finaliser.pending
        assert await finaliser.run_once() == 1
        assert finaliser.looks - swept == 1
        assert (await jobs_repo.get(conn, job_id)).state is JobState.COMPLETED  # type: ignore[union-attr]


async def test_a_job_seen_with_a_task_to_place_is_looked_at_by_the_end_of_its_hold(
    pool: Pool, redis: Redis, namespace: str
) -> None:
    finaliser = await _swept(pool, redis, namespace, waiting_hold_s=0)
    swept = finaliser.looks
    async with pool.acquire() as conn:
        # given an ended job told of after a read that saw it with a task to place
        job_id = await _job_with_tasks(conn, ["completed"])
        finaliser.unfinished([job_id], time.monotonic())
        finaliser.touch(job_id)
        # when no read comes, and its hold (none here) has passed, it is looked at
        assert await finaliser.run_once() == 1
        assert finaliser.looks - swept == 1


async def test_an_ended_jobs_keys_are_purged_once_more_later_and_no_more(
    pool: Pool, redis: Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finaliser_module, "REPURGE_AFTER_S", 0.0)
    keys = RedisKeys(namespace)
    finaliser = await _swept(pool, redis, namespace, purge_every_s=0)
    async with pool.acquire() as conn:
        # given a job that ended, told of, with a key a worker wrote
        job_id = await _job_with_tasks(conn, ["completed"])
        await redis.hset(keys.job_exits(job_id), "t", "0")
        finaliser.touch(job_id)

        # when the finaliser ends it, then a late writer adds its key again, twice
        assert await finaliser.run_once() == 1
        purged = await redis.exists(keys.job_exits(job_id))
        await redis.hset(keys.job_exits(job_id), "t", "0")
        await finaliser.run_once()
        purged_again = await redis.exists(keys.job_exits(job_id))
        await redis.hset(keys.job_exits(job_id), "t", "0")
        await finaliser.run_once()

        # then the key went at its end and once more, and the third is left to its TTL
        assert (purged, purged_again) == (0, 0)
        assert await redis.exists(keys.job_exits(job_id)) == 1
