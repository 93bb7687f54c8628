"""The worker's one-statement moves (`tasks_repo.Advance`): states passed with one
event each, attempts closed and opened with the move, and nothing written when the guard does
not match."""

import uuid
from typing import Any
from uuid import UUID

import pytest

from shared.domain.errors import InvalidTransition
from shared.domain.states import Stage, TaskState
from shared.store import attempts_repo, db, jobs_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.store.tasks_repo import CloseAttempt, OpenAttempt

pytestmark = pytest.mark.integration


async def _advance(
    conn: db.Connection,
    task: tasks_repo.Task,
    claim: UUID,
    path: list[TaskState],
    **options: Any,
) -> tasks_repo.Task | None:
    """One move alone, as the writer makes a lone one (`Advance.apply`)."""
    return await tasks_repo.Steps(path, **options).of(task, claim).apply(conn)


S = TaskState


async def _held(conn: db.Connection, state: TaskState, **columns: Any) -> tasks_repo.Task:
    """Given-step: a one-task job whose task rests in `state`, held by a fresh claim."""
    user = await users_repo.ensure_user(
        conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    job, _ = await jobs_repo.create(conn, user.id, NewJob("demo", "shell", "true", ["in"]))
    columns |= {"state": state.value, "claim": uuid.uuid4(), "host": "h-1", "worker": "w-1"}
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
    await conn.execute(f"UPDATE tasks SET {sets} WHERE job_id = $1", job.id, *columns.values())
    task = (await tasks_repo.list_for_job(conn, job.id))[0]
    return task


async def _running(conn: db.Connection) -> tasks_repo.Task:
    """Given-step: a held task `on_cpu` in its cluster attempt, number 2."""
    task = await _held(conn, S.ON_CPU, attempt=2)
    await conn.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage) VALUES ($1, 2, 1, 'cluster')",
        task.id,
    )
    return task


async def _events(conn: db.Connection, task: tasks_repo.Task) -> list[tuple[str, str | None]]:
    rows = await conn.fetch(
        "SELECT body FROM outbox WHERE body->>'task_id' = $1 AND body->>'state' <> 'new'"
        " ORDER BY id",
        task.id,
    )
    return [(r["body"]["state"], r["body"]["previous"]) for r in rows]


async def test_a_move_through_two_states_writes_one_event_per_state_and_swaps_attempts(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _running(conn)
        assert task.claim is not None

        moved = await _advance(
            conn,
            task,
            task.claim,
            [S.ON_CPU, S.DATA_READY, S.POST_PROCESSING],
            changes={"exit_code": 0},
            close=CloseAttempt(2, {"status": "success"}, exit_code=0),
            open_=OpenAttempt(Stage.POST_PROCESSING.value, "h-1", "w-1"),
            unless_waits="post_processing",
        )

        assert moved is not None
        assert (moved.state, moved.attempt, moved.exit_code) == (S.POST_PROCESSING, 3, 0)
        assert await _events(conn, task) == [
            ("data_ready", "on_cpu"),
            ("post_processing", "data_ready"),
        ]
        attempts = await attempts_repo.list_for_task(conn, task.id)
        assert [(a.attempt, a.stage, a.outcome) for a in attempts] == [
            (2, "cluster", "data_ready"),  # where the command's stage led
            (3, "post_processing", None),
        ]
        assert attempts[0].status == {"status": "success"} and attempts[0].exit_code == 0
        assert attempts[0].ended_at is not None and attempts[1].ended_at is None


async def test_a_move_through_a_stage_with_nothing_to_do__records_its_attempt_ended(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _running(conn)
        assert task.claim is not None

        moved = await _advance(
            conn,
            task,
            task.claim,
            [S.ON_CPU, S.DATA_READY, S.POST_PROCESSING, S.COMPLETED],
            changes={"exit_code": 0, "claim": None, "worker": None},
            close=CloseAttempt(2, {"status": "success"}, exit_code=0),
            open_=OpenAttempt(
                Stage.POST_PROCESSING.value, "h-1", "w-1", done=True, status={"status": "success"}
            ),
            unless_waits="post_processing",
        )

        assert moved is not None
        assert (moved.state, moved.attempt, moved.claim) == (S.COMPLETED, 3, None)
        assert await _events(conn, task) == [
            ("data_ready", "on_cpu"),
            ("post_processing", "data_ready"),
            ("completed", "post_processing"),
        ]
        attempts = await attempts_repo.list_for_task(conn, task.id)
        assert [(a.attempt, a.stage, a.outcome, a.claim) for a in attempts] == [
            (2, "cluster", "data_ready", None),
            (3, "post_processing", "completed", task.claim),  # the claim it ran under
        ]
        assert attempts[1].ended_at is not None and attempts[1].status == {"status": "success"}


async def test_a_move_under_another_claim_writes_nothing(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _held(conn, S.QUEUED)

        moved = await _advance(
            conn,
            task,
            uuid.uuid4(),  # not the task's claim
            [S.QUEUED, S.ON_CPU],
            open_=OpenAttempt(Stage.CLUSTER.value, "h-1", "w-1", pid=42),
        )

        assert moved is None
        assert (await tasks_repo.get(conn, task.id)).state is S.QUEUED  # type: ignore[union-attr]
        assert await _events(conn, task) == []
        assert await attempts_repo.list_for_task(conn, task.id) == []


async def test_a_move_from_a_state_the_task_has_left_writes_nothing(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _held(conn, S.QUEUED)
        assert task.claim is not None
        await conn.execute("UPDATE tasks SET state = 'terminated' WHERE id = $1", task.id)

        moved = await _advance(conn, task, task.claim, [S.QUEUED, S.ON_CPU])

        assert moved is None
        assert await _events(conn, task) == []


async def test_a_move_of_a_suspended_job_is_refused_when_asked(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _held(conn, S.QUEUED)
        assert task.claim is not None
        await conn.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", task.job_id)

        refused = await _advance(
            conn, task, task.claim, [S.QUEUED, S.ON_CPU], unless_suspended=True
        )
        moved = await _advance(conn, task, task.claim, [S.QUEUED, S.ON_CPU])

        assert refused is None
        assert moved is not None and moved.state is S.ON_CPU


async def test_a_move_that_skips_a_step_of_the_table_is_a_programming_error(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _held(conn, S.QUEUED)
        assert task.claim is not None

        with pytest.raises(InvalidTransition):
            await _advance(conn, task, task.claim, [S.QUEUED, S.COMPLETED])
