"""A take of a task of a job the worker knows reads nothing: the planning round's
work message carries the task as its claim left it and its job's row version, and a worker
that read the job at that version takes the task from the message (`Tenure.taking`,
`services/worker/claims.py`)."""

import uuid
from pathlib import Path

import pytest

from services.worker.claims import JobCache, Taker
from services.worker.tenure import Tenure
from shared.domain.messages import RunStage
from shared.domain.states import TaskState
from shared.store import db, jobs_repo, plan_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.store.transition_writer import TransitionWriter

pytestmark = pytest.mark.integration


async def _job(pool: db.Pool, inputs: int) -> jobs_repo.Job:
    """Given-step: a job of `inputs` new tasks, and a host to claim them for."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(
            conn, user.id, NewJob("known", "shell", "true", [str(i) for i in range(inputs)])
        )
    return job


async def _claim(pool: db.Pool, job_id: str, count: int) -> list[RunStage]:
    """The planning round's claim of `count` more tasks of the job: their work messages, by
    their tasks' index."""
    host = f"h-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        before = await conn.fetchval("SELECT coalesce(max(id), 0) FROM outbox")
        await plan_repo.claim(conn, [plan_repo.Claim(job_id, host, count)])
        rows = await conn.fetch(
            "SELECT body FROM outbox WHERE exchange = 'work' AND id > $1"
            " AND body->>'job_id' = $2 ORDER BY (body->'claimed'->>'index')::int",
            before,
            job_id,
        )
    return [RunStage.model_validate(row["body"]) for row in rows]


async def _version(pool: db.Pool, job_id: str) -> int:
    return int(await pool.fetchval("SELECT xmin::text::bigint FROM jobs WHERE id = $1", job_id))


async def test_a_claims_work_message_carries_the_task_as_claimed_and_its_jobs_version(
    pool: db.Pool,
) -> None:
    job = await _job(pool, 2)

    messages = await _claim(pool, job.id, 2)

    assert len(messages) == 2
    async with pool.acquire() as conn:
        for message in messages:
            assert message.claimed is not None
            task = await tasks_repo.get(conn, message.task_id)
            assert tasks_repo.Task.from_json(message.claimed) == task
            assert task is not None and task.claim == message.claim
    assert {m.job_version for m in messages} == {await _version(pool, job.id)}


async def test_the_message_of_a_jobs_first_input_carries_the_job_and_is_taken_unread(
    pool: db.Pool, tmp_path: Path
) -> None:
    # given a job of one task (W1's shape), claimed
    job = await _job(pool, 1)
    [message] = await _claim(pool, job.id, 1)
    async with pool.acquire() as conn:
        read = await jobs_repo.get(conn, job.id, with_counts=False)

    # then its message carries the job as it is
    assert message.job is not None and jobs_repo.Job.from_json(message.job) == read

    # and a worker that never read the job takes the task from the message alone
    taker = Taker(pool, "w-first", "h-first", tmp_path, TransitionWriter(pool))
    held = await Tenure.taking(taker, message)
    assert held is not None and held.state is TaskState.SETTING_UP and held.job == read
    assert taker.jobs.hits == 1


async def test_a_take_of_a_known_jobs_task_reads_nothing_and_a_changed_job_is_read_again(
    pool: db.Pool, tmp_path: Path
) -> None:
    # given a job of four tasks, three of them claimed, and a worker that took the first
    # (whose message carried the job)
    job = await _job(pool, 4)
    first, second, third = await _claim(pool, job.id, 3)
    assert first.job is not None and second.job is None
    taker = Taker(pool, "w-known", "h-known", tmp_path, TransitionWriter(pool))
    assert await Tenure.taking(taker, first) is not None
    assert taker.jobs.hits == 1

    # when it takes the second (claimed with the job as it read it)
    held = await Tenure.taking(taker, second)

    # then it read nothing: the task is as claimed, the job as the first message had it
    assert taker.jobs.hits == 2
    assert held is not None and held.state is TaskState.SETTING_UP and held.job.id == job.id
    assert held.task.id == second.task_id and held.cluster_starts == 0

    # when the job changes (a throttle: a new row version), and its last task is claimed
    async with pool.acquire() as conn:
        await jobs_repo.throttle(conn, job.id, 7, None)
    [fourth] = await _claim(pool, job.id, 1)
    assert fourth.job_version != second.job_version

    # then the take of the fourth reads the job again, and so does that of the third
    # (claimed before that job's row changed: older than what the worker knows)
    assert await Tenure.taking(taker, fourth) is not None
    assert (await Tenure.taking(taker, third)) is not None
    assert taker.jobs.hits == 2


async def test_a_task_past_its_first_attempt_is_read_for_its_cluster_starts(
    pool: db.Pool, tmp_path: Path
) -> None:
    # given a worker that knows the job, and a message whose task has run before
    job = await _job(pool, 2)
    first, second = await _claim(pool, job.id, 2)
    taker = Taker(pool, "w-known", "h-known", tmp_path, TransitionWriter(pool))
    assert await Tenure.taking(taker, first) is not None
    assert second.claimed is not None
    ran = second.model_copy(update={"claimed": second.claimed | {"attempt": 1}})

    # when it takes it, then it reads it (its cluster starts count over its attempts)
    assert await Tenure.taking(taker, ran) is not None
    assert taker.jobs.hits == 1  # the first's, whose message carried the job


async def test_a_message_whose_rows_cannot_be_read_back_is_taken_through_the_read(
    pool: db.Pool, tmp_path: Path
) -> None:
    # given a one-task job's message whose task row lacks a column (not what a claim writes)
    job = await _job(pool, 1)
    [message] = await _claim(pool, job.id, 1)
    assert message.claimed is not None
    broken = {k: v for k, v in message.claimed.items() if k != "created_at"}
    taker = Taker(pool, "w-broken", "h-broken", tmp_path, TransitionWriter(pool))

    # when a worker takes it, then it reads the task and takes it as ever
    held = await Tenure.taking(taker, message.model_copy(update={"claimed": broken}))
    assert held is not None and held.state is TaskState.SETTING_UP
    assert held.task.created_at is not None and taker.jobs.hits == 0


async def test_the_cache_keeps_the_latest_jobs_at_the_version_they_were_read(
    pool: db.Pool,
) -> None:
    cache = JobCache(most=2)
    a, b, c = [await _job(pool, 1) for _ in range(3)]
    cache.keep(a, 1)
    cache.keep(b, 1)
    assert cache.get(a.id, 1) is a  # a is now the latest used
    cache.keep(c, 5)

    assert cache.get(b.id, 1) is None  # the least recently used went
    assert cache.get(a.id, 2) is None  # another version
    assert cache.get(a.id, 1) is a and cache.get(c.id, 5) is c
