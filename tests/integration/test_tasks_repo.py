"""Task rows: compare-and-set transitions with their outbox events, claim fencing, attempts."""

import asyncio
import uuid
from typing import Any

import pytest

from shared.domain.errors import InvalidTransition, StaleState
from shared.domain.messages import JobEvent, JobOutcome
from shared.domain.states import FailureClass, Stage, TaskState
from shared.store import attempts_repo, db, jobs_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.store.tasks_repo import ANY_CLAIM, UNCLAIMED
from tests.integration.waiting import until_blocked

pytestmark = pytest.mark.integration

S = TaskState


async def _task(conn: db.Connection, state: TaskState = S.NEW, **columns: Any) -> tasks_repo.Task:
    """Given-step: a one-task job whose task is put straight into `state` with `columns` set."""
    user = await users_repo.ensure_user(
        conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    job, _ = await jobs_repo.create(conn, user.id, NewJob("demo", "shell", "true", ["in"]))
    task_id = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", job.id)
    columns["state"] = state.value
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
    await conn.execute(f"UPDATE tasks SET {sets} WHERE id = $1", task_id, *columns.values())
    task = await tasks_repo.get(conn, task_id)
    assert task is not None
    return task


async def _events_of(
    conn: db.Connection, task: tasks_repo.Task
) -> list[tuple[str, dict[str, Any]]]:
    rows = await conn.fetch(
        "SELECT routing_key, body FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", task.job_id
    )
    return [(r["routing_key"], r["body"]) for r in rows]


async def _state_of(conn: db.Connection, task_id: str) -> TaskState:
    return TaskState(await conn.fetchval("SELECT state FROM tasks WHERE id = $1", task_id))


async def test_when_a_task_moves_along_its_table__the_row_changes_and_the_event_is_queued(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        task = await _task(conn)
        claim = uuid.uuid4()
        # when
        moved = await tasks_repo.transition(
            conn,
            task.id,
            S.SETTING_UP,
            claim=UNCLAIMED,
            changes={"claim": claim, "worker": "w-1", "host": "h-1"},
        )
        # then
        assert moved.state is S.SETTING_UP
        assert (moved.claim, moved.worker, moved.host) == (claim, "w-1", "h-1")
        assert moved.updated_at >= task.updated_at
        assert await _state_of(conn, task.id) is S.SETTING_UP
        key, body = (await _events_of(conn, task))[-1]
        assert key == f"task.setting_up.{task.job_id}"
        assert body["type"] == "task_event"
        assert (body["task_id"], body["state"], body["previous"]) == (task.id, "setting_up", "new")
        assert body["host"] == "h-1"


async def test_when_a_task_fails__its_failure_fields_are_set_and_carried_by_the_event(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        claim = uuid.uuid4()
        task = await _task(conn, S.ON_CPU, claim=claim, worker="w-1", host="h-1")
        failed = await tasks_repo.transition(
            conn,
            task.id,
            S.FAILED_ON_CLUSTER,
            claim=claim,
            changes={
                "failure_class": FailureClass.SIGNAL,
                "signal": 9,
                "error_brief": "killed by SIGKILL",
                "claim": None,
            },
        )
        assert failed.failure_class is FailureClass.SIGNAL
        assert (failed.signal, failed.error_brief, failed.claim) == (9, "killed by SIGKILL", None)
        key, body = (await _events_of(conn, task))[-1]
        assert key == f"task.failed_on_cluster.{task.job_id}"
        assert (body["failure_class"], body["signal"], body["previous"]) == ("signal", 9, "on_cpu")


async def test_when_a_job_event_is_given__it_is_queued_after_the_task_event(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.ON_CPU)
        event = JobEvent(job_id=task.job_id, outcome=JobOutcome.HUNG, task_id=task.id)
        await tasks_repo.transition(conn, task.id, S.FAILED_ON_CLUSTER, job_event=event)
        keys = [key for key, _body in await _events_of(conn, task)]
        assert keys[-2:] == [f"task.failed_on_cluster.{task.job_id}", f"job.hung.{task.job_id}"]


async def test_when_the_task_is_not_in_a_source_state__stale_state_is_raised_and_nothing_written(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        task = await _task(conn, S.NEW)
        before = await _events_of(conn, task)
        # when
        with pytest.raises(StaleState, match="new"):
            await tasks_repo.transition(conn, task.id, S.ON_CPU, changes={"pid": 123})
        # then
        reread = await tasks_repo.get(conn, task.id)
        assert reread is not None
        assert (reread.state, reread.pid) == (S.NEW, None)
        assert await _events_of(conn, task) == before


async def test_when_the_task_does_not_exist__stale_state_is_raised(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(StaleState, match="missing"):
            await tasks_repo.transition(conn, "t-doesnotexist", S.SETTING_UP)


async def test_when_among_leaves_no_allowed_source__invalid_transition_is_raised(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.NEW)
        with pytest.raises(InvalidTransition):
            await tasks_repo.transition(conn, task.id, S.ON_CPU, among=frozenset({S.NEW}))
        assert await _state_of(conn, task.id) is S.NEW


async def test_when_the_claim_does_not_match__stale_state_is_raised(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        claim = uuid.uuid4()
        task = await _task(conn, S.SETTING_UP, claim=claim, worker="w-1")
        before = await _events_of(conn, task)
        with pytest.raises(StaleState):
            await tasks_repo.transition(conn, task.id, S.QUEUED, claim=uuid.uuid4())
        assert await _state_of(conn, task.id) is S.SETTING_UP
        assert await _events_of(conn, task) == before
        moved = await tasks_repo.transition(conn, task.id, S.QUEUED, claim=claim)
        assert moved.state is S.QUEUED


async def test_when_the_claim_to_match_is_none__not_even_an_unclaimed_task_moves(
    pool: db.Pool,
) -> None:
    # A claim read as None (a task nobody held) fences like any other claim: it matches
    # nothing, as `claim = NULL` would (`tasks_repo._held_by`); UNCLAIMED says "unclaimed".
    async with pool.acquire() as conn:
        task = await _task(conn, S.SETTING_UP)
        with pytest.raises(StaleState):
            await tasks_repo.transition(conn, task.id, S.QUEUED, claim=None)
        assert await _state_of(conn, task.id) is S.SETTING_UP


async def test_when_a_fenced_move_finds_the_task_moved_on__stale_state_is_raised(
    pool: db.Pool,
) -> None:
    # A late failure report for `on_cpu` must not fail a task that has reached `data_ready`.
    async with pool.acquire() as conn:
        task = await _task(conn, S.DATA_READY)
        with pytest.raises(StaleState):
            await tasks_repo.transition(
                conn, task.id, S.FAILED_ON_CLUSTER, among=frozenset({S.ON_CPU})
            )
        assert await _state_of(conn, task.id) is S.DATA_READY


async def test_when_a_claimed_task_must_be_unclaimed__stale_state_is_raised(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.NEW, claim=uuid.uuid4(), worker="w-1")
        with pytest.raises(StaleState):
            await tasks_repo.transition(conn, task.id, S.SETTING_UP, claim=UNCLAIMED)
        assert await _state_of(conn, task.id) is S.NEW


async def test_when_any_claim_is_accepted__a_claimed_task_moves(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.ON_CPU, claim=uuid.uuid4(), worker="w-1")
        moved = await tasks_repo.transition(conn, task.id, S.TERMINATED, claim=ANY_CLAIM)
        assert moved.state is S.TERMINATED


async def test_when_claiming_a_task__only_the_first_claim_wins(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.QUEUED)
        first, second = uuid.uuid4(), uuid.uuid4()
        assert await tasks_repo.set_claim(conn, task.id, S.QUEUED, first, "w-1")
        assert not await tasks_repo.set_claim(conn, task.id, S.QUEUED, second, "w-2")
        reread = await tasks_repo.get(conn, task.id)
        assert reread is not None
        assert (reread.claim, reread.worker, reread.state) == (first, "w-1", S.QUEUED)


async def test_when_claiming_a_task_in_another_state__the_claim_is_refused(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.NEW)
        assert not await tasks_repo.set_claim(conn, task.id, S.QUEUED, uuid.uuid4())


async def test_when_two_connections_move_one_task_at_once__exactly_one_wins(
    pool: db.Pool,
) -> None:
    # given: two destinations neither of which can be left for the other
    async with pool.acquire() as setup:
        task = await _task(setup, S.SETTING_UP)
        before = len(await _events_of(setup, task))

    async def move(dst: TaskState) -> TaskState | None:
        async with pool.acquire() as conn:
            try:
                return (await tasks_repo.transition(conn, task.id, dst)).state
            except StaleState:
                return None

    # when
    results = await asyncio.gather(move(S.QUEUED), move(S.FAILED_TO_SETUP))
    # then
    winners = [state for state in results if state is not None]
    assert len(winners) == 1
    async with pool.acquire() as conn:
        assert await _state_of(conn, task.id) is winners[0]
        events = (await _events_of(conn, task))[before:]
        assert [key for key, _body in events] == [f"task.{winners[0]}.{task.job_id}"]


async def test_when_a_transition_waits_on_an_uncommitted_one__it_loses_once_that_commits(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as first, pool.acquire() as second:
        # given: the first connection moved the task but has not committed yet
        task = await _task(first, S.SETTING_UP)
        transaction = first.transaction()
        await transaction.start()
        await tasks_repo.transition(first, task.id, S.QUEUED)
        # when: the second tries another move, then the first commits
        racer = asyncio.create_task(
            tasks_repo.transition(second, task.id, S.FAILED_TO_SETUP), name="racer"
        )
        await until_blocked(pool, second.get_server_pid())
        await transaction.commit()
        # then
        with pytest.raises(StaleState):
            async with asyncio.timeout(10):
                await racer
        assert await _state_of(second, task.id) is S.QUEUED
        keys = [key for key, _body in await _events_of(second, task)]
        assert f"task.failed_to_setup.{task.job_id}" not in keys


@pytest.mark.parametrize(
    "column", ["state", "job_id", "input", "id", "claim = NULL, state", "nonexistent"]
)
async def test_when_changes_name_a_column_that_is_not_settable__value_error_is_raised(
    pool: db.Pool, column: str
) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.NEW)
        before = await _events_of(conn, task)
        with pytest.raises(ValueError, match="cannot set"):
            await tasks_repo.transition(conn, task.id, S.SETTING_UP, changes={column: "x"})
        assert await _state_of(conn, task.id) is S.NEW
        assert await _events_of(conn, task) == before


async def test_when_asking_what_a_worker_holds__only_its_claimed_tasks_come_by_id(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        worker = f"w-{uuid.uuid4().hex[:8]}"
        held = [
            await _task(conn, S.SETTING_UP, claim=uuid.uuid4(), worker=worker),
            await _task(conn, S.ON_CPU, claim=uuid.uuid4(), worker=worker),
            await _task(conn, S.RECOVERING_CLUSTER, claim=uuid.uuid4(), worker=worker),
        ]
        await _task(conn, S.ON_CPU, claim=uuid.uuid4(), worker="someone-else")
        await _task(conn, S.QUEUED, claim=None, worker=worker)
        found = await tasks_repo.held_by(conn, worker)
        assert [t.id for t in found] == sorted(t.id for t in held)
        assert {t.state for t in found} == {S.SETTING_UP, S.ON_CPU, S.RECOVERING_CLUSTER}


async def test_when_a_held_task_ended_with_its_claim_left_set__held_by_leaves_it_out(
    pool: db.Pool,
) -> None:
    # `held_by` promises non-terminal tasks: a finished task is no longer held, whatever
    # the claim column still says (a reconciling supervisor would otherwise "lose" it again).
    async with pool.acquire() as conn:
        worker = f"w-{uuid.uuid4().hex[:8]}"
        running = await _task(conn, S.ON_CPU, claim=uuid.uuid4(), worker=worker)
        await _task(conn, S.COMPLETED, claim=uuid.uuid4(), worker=worker)
        await _task(conn, S.FAILED_ON_CLUSTER, claim=uuid.uuid4(), worker=worker)
        found = await tasks_repo.held_by(conn, worker)
        assert [t.id for t in found] == [running.id]


async def test_when_listing_a_jobs_tasks__they_come_by_index(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn)
        async with conn.transaction():
            await jobs_repo.add_tasks(conn, task.job_id, ["b", "c"], start_index=1)
        tasks = await tasks_repo.list_for_job(conn, task.job_id)
        assert [(t.index, t.input) for t in tasks] == [(0, "in"), (1, "b"), (2, "c")]
        assert await tasks_repo.get(conn, "t-doesnotexist") is None


async def test_when_progress_is_set__the_task_shows_it(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.ON_CPU)
        await tasks_repo.set_progress(conn, task.id, 42)
        reread = await tasks_repo.get(conn, task.id)
        assert reread is not None
        assert reread.progress == 42


async def test_when_attempts_start__they_are_numbered_per_task_with_the_run_number(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        # given
        claim = uuid.uuid4()
        task = await _task(conn, S.SETTING_UP, claim=claim, worker="w-1", run_number=2)
        # when
        first = await attempts_repo.start(
            conn, task.id, claim, Stage.SETUP, host="h-1", worker="w-1", log_path="/l/1"
        )
        second = await attempts_repo.start(
            conn, task.id, claim, Stage.CLUSTER, host="h-1", worker="w-1"
        )
        # then
        assert (first.attempt, first.run_number, first.stage) == (1, 2, "setup")
        assert (first.host, first.worker, first.claim, first.log_path) == (
            "h-1",
            "w-1",
            claim,
            "/l/1",
        )
        assert first.ended_at is None
        assert (second.attempt, second.stage) == (2, "cluster")
        reread = await tasks_repo.get(conn, task.id)
        assert reread is not None
        assert reread.attempt == 2


async def test_when_an_attempt_starts_with_a_stale_claim__stale_state_is_raised(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        task = await _task(conn, S.SETTING_UP, claim=uuid.uuid4(), worker="w-1")
        with pytest.raises(StaleState):
            await attempts_repo.start(
                conn, task.id, uuid.uuid4(), Stage.SETUP, host="h-1", worker="w-2"
            )
        assert await attempts_repo.list_for_task(conn, task.id) == []
        reread = await tasks_repo.get(conn, task.id)
        assert reread is not None
        assert reread.attempt == 0


async def test_when_an_attempt_finishes_twice__the_first_outcome_stays(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        # given
        claim = uuid.uuid4()
        task = await _task(conn, S.ON_CPU, claim=claim, worker="w-1")
        attempt = await attempts_repo.start(
            conn, task.id, claim, Stage.CLUSTER, host="h-1", worker="w-1"
        )
        await attempts_repo.set_pid(conn, task.id, attempt.attempt, 4242)
        # when
        await attempts_repo.finish(
            conn,
            task.id,
            attempt.attempt,
            "failed_on_cluster",
            exit_code=3,
            failure_class=FailureClass.EXIT,
            error_brief="exit 3",
            error_detail="tail of stderr",
        )
        await attempts_repo.finish(conn, task.id, attempt.attempt, "data_ready", exit_code=0)
        # then
        (row,) = await attempts_repo.list_for_task(conn, task.id)
        assert row.ended_at is not None
        assert (row.outcome, row.exit_code, row.failure_class) == ("failed_on_cluster", 3, "exit")
        assert (row.pid, row.error_brief, row.error_detail) == (4242, "exit 3", "tail of stderr")


async def test_when_closing_open_attempts__only_the_open_ones_are_closed(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        # given: one attempt finished, one still open
        claim = uuid.uuid4()
        task = await _task(conn, S.ON_CPU, claim=claim, worker="w-1")
        done = await attempts_repo.start(
            conn, task.id, claim, Stage.SETUP, host="h-1", worker="w-1"
        )
        await attempts_repo.finish(conn, task.id, done.attempt, "queued")
        await attempts_repo.start(conn, task.id, claim, Stage.CLUSTER, host="h-1", worker="w-1")
        # when
        await attempts_repo.close_open(
            conn, task.id, "failed_on_cluster", FailureClass.LOST, "worker w-1 lost"
        )
        # then
        first, second = await attempts_repo.list_for_task(conn, task.id)
        assert (first.outcome, first.failure_class) == ("queued", None)
        assert (second.outcome, second.failure_class) == ("failed_on_cluster", "lost")
        assert second.error_brief == "worker w-1 lost"
        assert second.ended_at is not None
