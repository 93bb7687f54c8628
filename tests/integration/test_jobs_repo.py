"""Job rows: creation with tasks and events in one transaction, idempotency, paging, finishing."""

import uuid
from typing import Any

import asyncpg
import pytest

from shared.domain.errors import StaleState
from shared.domain.messages import JobOutcome
from shared.domain.states import JobState, TaskState
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


async def _owner(conn: db.Connection) -> str:
    user = await users_repo.ensure_user(
        conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    return user.id


def _submission(inputs: list[Any], **fields: Any) -> NewJob:
    return NewJob(name="demo", type="shell", command='echo "$VIGIL_INPUT"', inputs=inputs, **fields)


async def _events_of(conn: db.Connection, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await conn.fetch(
        "SELECT routing_key, body FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", job_id
    )
    return [(r["routing_key"], r["body"]) for r in rows]


async def _set_task_states(conn: db.Connection, job_id: str, states: list[TaskState]) -> None:
    """Given-step shortcut: put the job's tasks, by index, straight into `states`."""
    for index, state in enumerate(states):
        await conn.execute(
            "UPDATE tasks SET state = $3 WHERE job_id = $1 AND index = $2",
            job_id,
            index,
            state.value,
        )


async def test_when_a_job_is_created_with_three_inputs__three_new_tasks_and_events_are_written(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        owner = await _owner(conn)
        inputs: list[Any] = ["a.txt", {"seed": 7}, 3]
        # when
        job, created = await jobs_repo.create(conn, owner, _submission(inputs, policy={"x": 1}))
        # then
        assert created
        assert job.state is JobState.ACTIVE
        assert job.owner_id == owner
        assert job.policy == {"x": 1}
        assert job.counts == {"new": 3}
        tasks = await conn.fetch(
            "SELECT id, index, input, state FROM tasks WHERE job_id = $1 ORDER BY index", job.id
        )
        assert [(t["index"], t["input"], t["state"]) for t in tasks] == [
            (0, "a.txt", "new"),
            (1, {"seed": 7}, "new"),
            (2, 3, "new"),
        ]
        events = await _events_of(conn, job.id)
        assert [key for key, _body in events] == [f"task.new.{job.id}"] * 3
        assert [body["task_id"] for _key, body in events] == [t["id"] for t in tasks]
        assert all(body["state"] == "new" for _key, body in events)


async def test_when_a_job_is_created__job_tasks_and_events_share_one_transaction(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        job, _created = await jobs_repo.create(conn, owner, _submission(["a", "b"]))
        # Rows written by one transaction carry the same xmin (its transaction id).
        xmins = {
            await conn.fetchval("SELECT xmin::text FROM jobs WHERE id = $1", job.id),
            *[
                r["xmin"]
                for r in await conn.fetch(
                    "SELECT xmin::text AS xmin FROM tasks WHERE job_id = $1", job.id
                )
            ],
            *[
                r["xmin"]
                for r in await conn.fetch(
                    "SELECT xmin::text AS xmin FROM outbox WHERE body->>'job_id' = $1", job.id
                )
            ],
        }
        assert len(xmins) == 1


async def test_when_an_input_is_json_null__it_is_stored_as_a_null_input(pool: db.Pool) -> None:
    # JSON null is a valid input value (the API accepts it); it must not become SQL NULL.
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        job, _created = await jobs_repo.create(conn, owner, _submission([None, "x"]))
        inputs = await conn.fetch(
            "SELECT input FROM tasks WHERE job_id = $1 ORDER BY index", job.id
        )
        assert [r["input"] for r in inputs] == [None, "x"]


async def test_when_task_creation_fails__no_job_and_no_event_is_left(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        name = f"doomed-{uuid.uuid4().hex[:8]}"
        # A NUL character cannot be stored in jsonb: the second task's insert fails.
        with pytest.raises(asyncpg.UntranslatableCharacterError):
            await jobs_repo.create(conn, owner, NewJob(name, "shell", "true", ["ok", "a\x00b"]))
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE name = $1", name) == 0


async def test_when_the_idempotency_key_is_reused__the_same_job_comes_back_not_created(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        owner = await _owner(conn)
        key = uuid.uuid4().hex
        first, first_created = await jobs_repo.create(
            conn, owner, _submission(["a", "b"], idempotency_key=key)
        )
        # when
        again, again_created = await jobs_repo.create(
            conn, owner, _submission(["c", "d", "e"], idempotency_key=key)
        )
        # then
        assert first_created
        assert not again_created
        assert again.id == first.id
        assert again.counts == {"new": 2}
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE job_id = $1", first.id) == 2
        assert len(await _events_of(conn, first.id)) == 2


async def test_when_two_owners_use_the_same_idempotency_key__each_gets_a_job(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        key = uuid.uuid4().hex
        one, one_created = await jobs_repo.create(
            conn, await _owner(conn), _submission(["a"], idempotency_key=key)
        )
        two, two_created = await jobs_repo.create(
            conn, await _owner(conn), _submission(["a"], idempotency_key=key)
        )
        assert one_created
        assert two_created
        assert one.id != two.id


async def test_when_no_idempotency_key_is_given__every_submission_is_a_new_job(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        one, _ = await jobs_repo.create(conn, owner, _submission(["a"]))
        two, two_created = await jobs_repo.create(conn, owner, _submission(["a"]))
        assert two_created
        assert one.id != two.id


async def test_when_listing_jobs_page_by_page__every_job_comes_once_newest_first(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        owner = await _owner(conn)
        created = [(await jobs_repo.create(conn, owner, _submission(["a"])))[0] for _ in range(5)]
        # when
        pages: list[list[str]] = []
        before = None
        while True:
            page = await jobs_repo.list_jobs(
                conn, owner_id=owner, state=None, name=None, limit=2, before=before
            )
            if not page:
                break
            pages.append([job.id for job in page])
            before = (page[-1].created_at, page[-1].id)
        # then
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [job_id for page_ids in pages for job_id in page_ids]
        newest_first = sorted(created, key=lambda j: (j.created_at, j.id), reverse=True)
        assert listed == [job.id for job in newest_first]


async def test_when_listing_jobs_with_filters__only_matching_jobs_come(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        other = await _owner(conn)
        name = f"n-{uuid.uuid4().hex[:8]}"
        mine, _ = await jobs_repo.create(conn, owner, NewJob(name, "shell", "true", ["a"]))
        cancelled, _ = await jobs_repo.create(conn, owner, NewJob(name, "shell", "true", ["a"]))
        await jobs_repo.transition(conn, cancelled.id, JobState.CANCELLED)
        theirs, _ = await jobs_repo.create(conn, other, NewJob(name, "shell", "true", ["a"]))

        def ids(jobs: list[jobs_repo.Job]) -> set[str]:
            return {job.id for job in jobs}

        by_owner = await jobs_repo.list_jobs(
            conn, owner_id=owner, state=None, name=None, limit=10, before=None
        )
        active_by_name = await jobs_repo.list_jobs(
            conn, owner_id=None, state=JobState.ACTIVE, name=name, limit=10, before=None
        )
        assert ids(by_owner) == {mine.id, cancelled.id}
        assert ids(active_by_name) == {mine.id, theirs.id}


async def test_when_looking_for_finished_jobs__only_active_jobs_with_all_tasks_terminal_come(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        owner = await _owner(conn)
        done, _ = await jobs_repo.create(conn, owner, _submission(["a", "b", "c"]))
        await _set_task_states(
            conn, done.id, [TaskState.COMPLETED, TaskState.FAILED_TO_SETUP, TaskState.COMPLETED]
        )
        running, _ = await jobs_repo.create(conn, owner, _submission(["a", "b"]))
        await _set_task_states(conn, running.id, [TaskState.COMPLETED, TaskState.RECOVER_CLUSTER])
        cancelled, _ = await jobs_repo.create(conn, owner, _submission(["a"]))
        await _set_task_states(conn, cancelled.id, [TaskState.TERMINATED])
        await jobs_repo.transition(conn, cancelled.id, JobState.CANCELLED)
        # when
        candidates = dict(await jobs_repo.finished_candidates(conn, limit=100_000))
        # then
        assert candidates.get(done.id) == {"completed": 2, "failed_to_setup": 1}
        assert running.id not in candidates
        assert cancelled.id not in candidates


async def test_when_a_job_has_no_task__it_is_not_a_finished_candidate(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        empty, _ = await jobs_repo.create(conn, owner, _submission([]))
        candidates = dict(await jobs_repo.finished_candidates(conn, limit=100_000))
        assert empty.id not in candidates


async def test_when_a_job_is_completed_twice__the_second_compare_and_set_raises_stale_state(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        owner = await _owner(conn)
        job, _ = await jobs_repo.create(conn, owner, _submission(["a"]))
        event = jobs_repo.outcome_event(job.id, JobState.COMPLETED)
        # when
        completed = await jobs_repo.transition(conn, job.id, JobState.COMPLETED, event)
        with pytest.raises(StaleState):
            await jobs_repo.transition(conn, job.id, JobState.COMPLETED, event)
        # then
        assert completed.state is JobState.COMPLETED
        assert completed.finished_at is not None
        job_events = [
            (key, body) for key, body in await _events_of(conn, job.id) if key.startswith("job.")
        ]
        assert [key for key, _body in job_events] == [f"job.succeeded.{job.id}"]
        assert job_events[0][1]["outcome"] == JobOutcome.SUCCEEDED.value


async def test_when_a_finished_job_becomes_active_again__finished_at_is_cleared(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        job, _ = await jobs_repo.create(conn, owner, _submission(["a"]))
        failed = await jobs_repo.transition(
            conn, job.id, JobState.FAILED, jobs_repo.outcome_event(job.id, JobState.FAILED)
        )
        active = await jobs_repo.transition(conn, job.id, JobState.ACTIVE)
        assert failed.finished_at is not None
        assert active.state is JobState.ACTIVE
        assert active.finished_at is None
        keys = [key for key, _body in await _events_of(conn, job.id)]
        assert f"job.failed.{job.id}" in keys


async def test_when_a_cancelled_job_is_resumed__stale_state_is_raised_and_nothing_written(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        job, _ = await jobs_repo.create(conn, owner, _submission(["a"]))
        await jobs_repo.transition(conn, job.id, JobState.CANCELLED)
        before = await _events_of(conn, job.id)
        with pytest.raises(StaleState):
            await jobs_repo.transition(
                conn, job.id, JobState.ACTIVE, jobs_repo.outcome_event(job.id, JobState.FAILED)
            )
        assert await _events_of(conn, job.id) == before
        reread = await jobs_repo.get(conn, job.id)
        assert reread is not None
        assert reread.state is JobState.CANCELLED


async def test_when_getting_a_job__its_counts_per_state_are_filled_in(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        job, _ = await jobs_repo.create(conn, owner, _submission(["a", "b", "c"]))
        await _set_task_states(conn, job.id, [TaskState.COMPLETED, TaskState.ON_CPU])
        reread = await jobs_repo.get(conn, job.id)
        assert reread is not None
        assert reread.counts == {"completed": 1, "on_cpu": 1, "new": 1}
        assert await jobs_repo.get(conn, "j-doesnotexist") is None


async def test_when_tasks_are_appended__they_continue_the_index_with_their_events(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        owner = await _owner(conn)
        job, _ = await jobs_repo.create(conn, owner, _submission(["a"]))
        async with conn.transaction():
            ids = await jobs_repo.add_tasks(conn, job.id, ["b", "c"], start_index=1)
        rows = await conn.fetch(
            "SELECT id, index, input FROM tasks WHERE job_id = $1 ORDER BY index", job.id
        )
        assert [(r["index"], r["input"]) for r in rows] == [(0, "a"), (1, "b"), (2, "c")]
        assert [r["id"] for r in rows[1:]] == ids
        assert [body["task_id"] for _key, body in await _events_of(conn, job.id)][1:] == ids


async def test_a_job_is_suspended_only_between_suspend_and_resume(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        job, _ = await jobs_repo.create(conn, await _owner(conn), _submission(["a"]))
        before = await jobs_repo.is_suspended(conn, job.id)
        await jobs_repo.transition(conn, job.id, JobState.SUSPENDED)
        during = await jobs_repo.is_suspended(conn, job.id)
        await jobs_repo.transition(conn, job.id, JobState.ACTIVE)
        after = await jobs_repo.is_suspended(conn, job.id)
        unknown = await jobs_repo.is_suspended(conn, "j-no-such-job")

    assert (before, during, after, unknown) == (False, True, False, False)
