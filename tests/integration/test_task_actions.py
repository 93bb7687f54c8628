"""Operator actions, appended inputs and chaining, on the real database through `shared/` alone.

Every (action, current state) pair is tried against `shared.domain.actions.plan`: the row moves to
the planned state with its event, or `Conflict` is raised and nothing is written.
"""

import asyncio
import uuid
from typing import Any

import pytest

from shared.domain.actions import JobAction, TaskAction, plan, targets
from shared.domain.errors import Conflict, NotFound
from shared.domain.messages import TaskEvent, to_jsonable
from shared.domain.states import FAILED, TERMINAL, FailureClass, JobState, TaskState
from shared.operations import datasets, task_actions
from shared.store import jobs_repo, tasks_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.integration.waiting import until_blocked

pytestmark = pytest.mark.integration

S = TaskState
ACTOR = "ops"


async def _job(conn: Connection, inputs: list[Any], **fields: Any) -> jobs_repo.Job:
    """Given-step: a job of a fresh user with one `new` task per input."""
    user = await users_repo.ensure_user(
        conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    job, _ = await jobs_repo.create(
        conn, user.id, NewJob("demo", "shell", "true", inputs, **fields)
    )
    return job


async def _task_ids(conn: Connection, job_id: str) -> list[str]:
    return await datasets.upstream_task_ids(conn, job_id)


async def _put(conn: Connection, task_id: str, state: TaskState, **columns: Any) -> None:
    """Given-step: force a task into `state` with `columns`, bypassing the table."""
    columns["state"] = state.value
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
    await conn.execute(f"UPDATE tasks SET {sets} WHERE id = $1", task_id, *columns.values())


async def _one_task(conn: Connection, state: TaskState, **columns: Any) -> tasks_repo.Task:
    job = await _job(conn, ["in"])
    [task_id] = await _task_ids(conn, job.id)
    await _put(conn, task_id, state, **columns)
    task = await tasks_repo.get(conn, task_id)
    assert task is not None
    return task


async def _outbox(conn: Connection, job_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    rows = await conn.fetch(
        "SELECT exchange, routing_key, body FROM outbox WHERE body->>'job_id' = $1 ORDER BY id",
        job_id,
    )
    return [(r["exchange"], r["routing_key"], r["body"]) for r in rows]


async def _prerequisites(conn: Connection, task_id: str) -> list[tuple[str, str, str]]:
    rows = await conn.fetch(
        "SELECT stage, on_task_id, required FROM task_prerequisites WHERE task_id = $1"
        " ORDER BY stage, on_task_id",
        task_id,
    )
    return [(r["stage"], r["on_task_id"], r["required"]) for r in rows]


def _allows(action: TaskAction, state: TaskState) -> bool:
    try:
        plan(action, state)
    except Conflict:
        return False
    return True


PAIRS = [(a, s) for a in TaskAction if a is not TaskAction.DUPLICATE for s in TaskState]


@pytest.mark.parametrize(("action", "state"), [p for p in PAIRS if _allows(*p)])
async def test_when_the_state_allows_the_action__the_task_moves_to_the_planned_state_with_its_event(
    pool: Pool, action: TaskAction, state: TaskState
) -> None:
    async with pool.acquire() as conn:
        # given
        task = await _one_task(conn, state)
        before = len(await _outbox(conn, task.job_id))

        # when
        result = await task_actions.apply_to_task(conn, task.id, action, ACTOR)

        # then
        target = plan(action, state).target
        assert target is not None and result.task.state is target
        assert result.created is None
        events = (await _outbox(conn, task.job_id))[before:]
        assert ("events", f"task.{target.value}.{task.job_id}") in [e[:2] for e in events]


@pytest.mark.parametrize(("action", "state"), [p for p in PAIRS if not _allows(*p)])
async def test_when_the_state_does_not_allow_the_action__conflict_names_the_allowed_states(
    pool: Pool, action: TaskAction, state: TaskState
) -> None:
    async with pool.acquire() as conn:
        task = await _one_task(conn, state)
        before = await _outbox(conn, task.job_id)

        with pytest.raises(Conflict) as refused:
            await task_actions.apply_to_task(conn, task.id, action, ACTOR)

        assert f"in state {state.value};" in str(refused.value)
        assert "allowed in: " in str(refused.value)
        assert await _outbox(conn, task.job_id) == before
        assert (await tasks_repo.get(conn, task.id)) == task


@pytest.mark.parametrize("state", sorted(set(TaskState) - TERMINAL))
async def test_when_duplicating_a_task_not_at_rest__conflict_is_raised(
    pool: Pool, state: TaskState
) -> None:
    async with pool.acquire() as conn:
        task = await _one_task(conn, state)

        with pytest.raises(Conflict, match="allowed in: completed, failed_on_cluster"):
            await task_actions.apply_to_task(conn, task.id, TaskAction.DUPLICATE, ACTOR)

        assert await _task_ids(conn, task.job_id) == [task.id]


async def test_when_a_task_with_prerequisites_is_duplicated__the_copy_waits_for_the_same_tasks(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        upstream = await _one_task(conn, S.COMPLETED)
        spec = {"setup": {upstream.id: "completed"}}
        job = await _job(conn, ["x", "y"], prerequisites=spec)
        await conn.execute(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " SELECT id, 'setup', $2, 'completed' FROM tasks WHERE job_id = $1",
            job.id,
            upstream.id,
        )
        first, _second = await _task_ids(conn, job.id)
        await _put(conn, first, S.TERMINATED)

        # when
        result = await task_actions.apply_to_task(conn, first, TaskAction.DUPLICATE, ACTOR)

        # then
        created = result.created
        assert created is not None
        assert (created.index, created.input, created.state) == (2, "x", S.NEW)
        assert result.task.state is S.TERMINATED
        assert await _prerequisites(conn, created.id) == [("setup", upstream.id, "completed")]


async def test_when_a_prerequisite_failure_is_recovered__the_old_error_is_cleared(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _one_task(
            conn, S.FAILED_SETUP_PREREQUISITES, failure_class="exit", error_brief="upstream died"
        )

        result = await task_actions.apply_to_task(conn, task.id, TaskAction.RECOVER, ACTOR)

        assert result.task.state is S.NEW
        assert (result.task.failure_class, result.task.error_brief) == (None, None)


async def test_when_a_cluster_failure_is_recovered__the_error_stays_for_the_hook_to_see(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _one_task(conn, S.FAILED_ON_CLUSTER, failure_class="exit", exit_code=3)

        result = await task_actions.apply_to_task(conn, task.id, TaskAction.RECOVER, ACTOR)

        assert result.task.state is S.RECOVER_CLUSTER
        assert (result.task.failure_class, result.task.exit_code) == (FailureClass.EXIT, 3)


async def test_when_a_running_task_is_cancelled__its_supervisor_is_asked_to_kill_it(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        task = await _one_task(conn, S.ON_CPU, host="node-7", pid=4242, pid_create_time=12.5)

        # when
        result = await task_actions.apply_to_task(conn, task.id, TaskAction.CANCEL, ACTOR)

        # then
        assert (result.task.state, result.task.failure_class) == (
            S.TERMINATED,
            FailureClass.CANCELLED,
        )
        assert result.task.error_brief == f"cancelled by {ACTOR}"
        work = [e for e in await _outbox(conn, task.job_id) if e[0] == "work"]
        assert [(key, body["type"], body["pid"]) for _, key, body in work] == [
            ("supervise.node-7", "kill_task", 4242)
        ]


async def test_when_the_task_or_job_does_not_exist__not_found_is_raised(pool: Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(NotFound):
            await task_actions.apply_to_task(conn, "t-missing", TaskAction.RECOVER, ACTOR)
        with pytest.raises(NotFound):
            await task_actions.apply_to_job(conn, "j-missing", JobAction.SUSPEND, ACTOR)
        with pytest.raises(NotFound):
            await datasets.add_inputs(conn, "j-missing", ["x"])


async def test_when_a_suspended_job_is_cancelled__its_tasks_not_at_rest_are_terminated(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        job = await _job(conn, ["a", "b", "c"])
        ids = await _task_ids(conn, job.id)
        await _put(conn, ids[1], S.COMPLETED)
        await _put(conn, ids[2], S.ON_HOLD)
        await task_actions.apply_to_job(conn, job.id, JobAction.SUSPEND, ACTOR)

        # when
        cancelled = await task_actions.apply_to_job(conn, job.id, JobAction.CANCEL, ACTOR)

        # then
        assert cancelled.state is JobState.CANCELLED
        assert cancelled.counts == {"terminated": 2, "completed": 1}
        keys = [key for _, key, _ in await _outbox(conn, job.id)]
        assert keys[-1] == f"job.cancelled.{job.id}"


async def test_when_inputs_are_appended_to_a_job_with_prerequisites__the_new_tasks_wait_too(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        upstream = await _one_task(conn, S.NEW)
        job = await _job(conn, ["a"], prerequisites={"post_processing": {upstream.id: "queued"}})

        # when
        [new] = await datasets.add_inputs(conn, job.id, ["b"])

        # then
        assert await _prerequisites(conn, new) == [("post_processing", upstream.id, "queued")]


async def test_when_jobs_are_chained_twice__an_input_appended_upstream_reaches_the_last_job(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given: a -> b -> c, all empty
        a = await _job(conn, ["first"])
        b = await _job(conn, [], inputs_from=a.id)
        await datasets.chain(conn, b.id, await datasets.upstream_task_ids(conn, a.id))
        c = await _job(conn, [], inputs_from=b.id)
        await datasets.chain(conn, c.id, await datasets.upstream_task_ids(conn, b.id))

        # when
        [appended] = await datasets.add_inputs(conn, a.id, ["second"])

        # then
        b_tasks = await tasks_repo.list_for_job(conn, b.id)
        c_tasks = await tasks_repo.list_for_job(conn, c.id)
        assert [t.index for t in b_tasks] == [0, 1] and [t.index for t in c_tasks] == [0, 1]
        assert b_tasks[1].input == {datasets.UPSTREAM_KEY: appended}
        assert c_tasks[1].input == {datasets.UPSTREAM_KEY: b_tasks[1].id}
        assert await _prerequisites(conn, c_tasks[1].id) == [("setup", b_tasks[1].id, "completed")]


async def test_when_a_chained_job_is_cancelled__inputs_appended_upstream_skip_it(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        a = await _job(conn, ["first"])
        b = await _job(conn, [], inputs_from=a.id)
        await datasets.chain(conn, b.id, await datasets.upstream_task_ids(conn, a.id))
        await task_actions.apply_to_job(conn, b.id, JobAction.CANCEL, ACTOR)

        await datasets.add_inputs(conn, a.id, ["second"])

        assert len(await _task_ids(conn, b.id)) == 1


async def test_when_chaining_from_a_job_without_tasks__no_task_is_made(pool: Pool) -> None:
    async with pool.acquire() as conn:
        a = await _job(conn, [])
        b = await _job(conn, [], inputs_from=a.id)

        made = await datasets.chain(conn, b.id, await datasets.upstream_task_ids(conn, a.id))

        assert made == [] and await _task_ids(conn, b.id) == []


@pytest.mark.parametrize("action", [TaskAction.RECOVER, TaskAction.DUPLICATE])
async def test_when_a_task_of_a_cancelled_job_is_acted_on__conflict_is_raised(
    pool: Pool, action: TaskAction
) -> None:
    async with pool.acquire() as conn:
        job = await _job(conn, ["a"])
        [task_id] = await _task_ids(conn, job.id)
        await _put(conn, task_id, S.FAILED_SETUP_PREREQUISITES)
        await task_actions.apply_to_job(conn, job.id, JobAction.CANCEL, ACTOR)

        with pytest.raises(Conflict, match="cancelled"):
            await task_actions.apply_to_task(conn, task_id, action, ACTOR)


async def test_two_duplicates_made_at_once_get_their_own_indexes(pool: Pool) -> None:
    async with pool.acquire() as conn:
        job = await _job(conn, ["a", "b"])
        first_task, second_task = await datasets.task_ids_of(conn, job.id)
        await conn.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", job.id)
    async with pool.acquire() as first, pool.acquire() as second:
        # given a duplicate made but not committed
        transaction = first.transaction()
        await transaction.start()
        await task_actions.apply_to_task(first, first_task, TaskAction.DUPLICATE, ACTOR)

        # when a second one picks the same index meanwhile (it waits on the first's insert)
        racing = asyncio.create_task(
            task_actions.apply_to_task(second, second_task, TaskAction.DUPLICATE, ACTOR)
        )
        await until_blocked(pool, second.get_server_pid())
        await transaction.commit()
        made = await racing

    # then it takes the next index instead of failing
    assert made.created is not None and made.created.index == 3
    async with pool.acquire() as conn:
        indexes = await conn.fetch("SELECT index FROM tasks WHERE job_id = $1 ORDER BY 1", job.id)
    assert [r["index"] for r in indexes] == [0, 1, 2, 3]


async def test_when_a_job_is_cancelled__each_task_not_at_rest_ends_as_one_cancel_would_end_it(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given: a running task (with an open attempt), a set-up one, a finished one, and one
        # of each on another job (left alone)
        job = await _job(conn, ["running", "queued", "done"])
        running, queued, done = await _task_ids(conn, job.id)
        claim = uuid.uuid4()
        await _put(
            conn,
            running,
            S.ON_CPU,
            host="node-3",
            pid=77,
            pid_create_time=1.5,
            claim=claim,
            run_number=2,
            exit_code=None,
        )
        await conn.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker, claim, pid)"
            " VALUES ($1, 1, 2, 'cluster', 'node-3', 'w-1', $2, 77)",
            running,
            claim,
        )
        await _put(conn, queued, S.QUEUED, host="node-4")
        await _put(conn, done, S.COMPLETED)
        other = await _one_task(conn, S.QUEUED)

        # when
        await task_actions.apply_to_job(conn, job.id, JobAction.CANCEL, ACTOR)

        # then: the tasks moved, their events read back as the model writes them, in order
        brief = f"cancelled by {ACTOR}"
        tasks = {t.id: t for t in await tasks_repo.list_for_job(conn, job.id)}
        assert [tasks[t].state for t in (running, queued, done)] == [
            S.TERMINATED,
            S.TERMINATED,
            S.COMPLETED,
        ]
        assert {
            (tasks[t].failure_class, tasks[t].error_brief, tasks[t].claim)
            for t in (running, queued)
        } == {(FailureClass.CANCELLED, brief, None)}
        rows = await _outbox(conn, job.id)
        events = [
            TaskEvent.model_validate(body) for _, key, body in rows if key.startswith("task.term")
        ]
        assert [e.model_dump(exclude={"message_id", "sent_at"}) for e in events] == [
            TaskEvent(
                job_id=job.id,
                task_id=running,
                state=S.TERMINATED,
                previous=S.ON_CPU,
                run_number=2,
                host="node-3",
                failure_class=FailureClass.CANCELLED,
                error_brief=brief,
            ).model_dump(exclude={"message_id", "sent_at"}),
            TaskEvent(
                job_id=job.id,
                task_id=queued,
                state=S.TERMINATED,
                previous=S.QUEUED,
                host="node-4",
                failure_class=FailureClass.CANCELLED,
                error_brief=brief,
            ).model_dump(exclude={"message_id", "sent_at"}),
        ]
        model = to_jsonable(events[0])
        assert all(set(body) == set(model) for _, k, body in rows if k.startswith("task.term"))
        # the running one's supervisor is told to kill it; its attempt is closed
        kills = [(key, body) for exchange, key, body in rows if exchange == "work"]
        assert [(k, b["pid"], b["create_time"], b["claim"]) for k, b in kills] == [
            ("supervise.node-3", 77, 1.5, str(claim))
        ]
        attempt = await conn.fetchrow(
            "SELECT outcome, failure_class, error_brief, ended_at FROM attempts WHERE task_id = $1",
            running,
        )
        assert attempt is not None and attempt["ended_at"] is not None
        assert (attempt["outcome"], attempt["failure_class"], attempt["error_brief"]) == (
            "terminated",
            "cancelled",
            brief,
        )
        assert [t.state for t in await tasks_repo.list_for_job(conn, other.job_id)] == [S.QUEUED]


async def test_when_a_jobs_failed_tasks_are_recovered__each_moves_as_one_recover_would(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given: a failed job with a task failed in each failed state, and a completed one
        failed = sorted(FAILED)
        job = await _job(conn, [s.value for s in failed] + ["done"])
        ids = await _task_ids(conn, job.id)
        for task_id, state in zip(ids, failed, strict=False):
            await _put(
                conn,
                task_id,
                state,
                failure_class="exit",
                exit_code=3,
                error_brief="boom",
                claim=uuid.uuid4(),
                host="node-1",
                run_number=2,
            )
        await _put(conn, ids[-1], S.COMPLETED)
        await conn.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", job.id)
        # and one failed task already resubmitted: its clone carries the input on
        [superseded] = await datasets.add_inputs(conn, job.id, ["resubmitted"])
        await _put(conn, superseded, S.FAILED_ON_CLUSTER, superseded_by=ids[-1])
        await conn.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", job.id)

        # when
        recovered = await task_actions.apply_to_job(conn, job.id, JobAction.RECOVER_FAILED, ACTOR)

        # then: the job is active again, each task where `plan` says, with its event
        assert recovered.state is JobState.ACTIVE
        tasks = {t.id: t for t in await tasks_repo.list_for_job(conn, job.id)}
        for task_id, state in zip(ids, failed, strict=False):
            step = plan(TaskAction.RECOVER, state)
            task = tasks[task_id]
            assert (task.state, task.claim) == (step.target, None)
            kept = (FailureClass.EXIT, 3, "boom") if step.hook else (None, None, None)
            assert (task.failure_class, task.exit_code, task.error_brief) == kept
        assert tasks[ids[-1]].state is S.COMPLETED
        assert tasks[superseded].state is S.FAILED_ON_CLUSTER
        events = [
            TaskEvent.model_validate(body)
            for _, key, body in await _outbox(conn, job.id)
            if key.split(".")[1] in {s.value for s in targets(TaskAction.RECOVER).values()}
            and body["previous"] is not None  # not the tasks' `task.new` of their submission
        ]
        expected = [
            TaskEvent(
                job_id=job.id,
                task_id=task_id,
                state=tasks[task_id].state,
                previous=state,
                run_number=2,
                host="node-1",
                failure_class=tasks[task_id].failure_class,
                exit_code=tasks[task_id].exit_code,
                error_brief=tasks[task_id].error_brief,
            )
            for task_id, state in zip(ids, failed, strict=False)
        ]
        dump = {"message_id", "sent_at"}
        assert [e.model_dump(exclude=dump) for e in events] == [
            e.model_dump(exclude=dump) for e in expected
        ]
