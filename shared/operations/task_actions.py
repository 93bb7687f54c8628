"""Applying operator actions to tasks and jobs: compare-and-set transitions with their events.

The API calls these inside one transaction per request. Each function checks the current state
against the tables of `shared.domain.actions` and raises `Conflict` (a 409) naming the allowed
states; a task superseded by its resubmitted clone is refused every action but `cancel`, naming
the task that carries its input on (`lineage.refuse_superseded`).
Hooks are not run here: an action state (`recover_cluster`, `restart_setup`...) is picked up by
the scheduler, which dispatches it to the task's host.
"""

import logging
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from shared.domain.actions import JobAction, Plan, TaskAction, plan, targets
from shared.domain.errors import Conflict, NotFound, StaleState
from shared.domain.messages import FreezeTask, JobEvent, JobOutcome, KillTask
from shared.domain.states import ACTIONS, FAILED, QUIET, TERMINAL, FailureClass, JobState, TaskState
from shared.messaging.topology import supervise_key
from shared.operations import harvest, lineage, stop_guard
from shared.store import attempts_repo, jobs_repo, outbox, prerequisites_repo, tasks_repo
from shared.store.db import Connection

logger = logging.getLogger(__name__)

#: Tries of a job action that PostgreSQL aborts to let a concurrent writer through (a deadlock,
#: e.g. a cancel of a running job's tasks and a planning round claiming some of them in
#: another order): nothing was written, so it is tried again, whole.
JOB_ACTION_TRIES: Final = 3

S = TaskState


@dataclass(frozen=True)
class ActionResult:
    """What an action did: the task as it now is, and the new task of a `duplicate`."""

    task: tasks_repo.Task
    created: tasks_repo.Task | None = None


async def apply_to_task(
    conn: Connection, task_id: str, action: TaskAction, actor: str
) -> ActionResult:
    """Apply `action` to the task; raises `NotFound` or `Conflict`. One transaction."""
    async with conn.transaction():
        await stop_guard.share(conn)  # first: it may reopen the job (see stop_guard)
        task = await _locked(conn, task_id)
        await lineage.refuse_superseded(conn, task, action)
        if action is not TaskAction.CANCEL:
            await _check_job_not_cancelled(conn, task.job_id, action)
        await _check_test_still_configuring(conn, task)
        step = plan(action, task.state, task.id)
        if step.duplicate:
            return ActionResult(task, await duplicate(conn, task))
        moved = await _move(conn, task, step, action, actor)
        if moved.state not in TERMINAL:
            await reopen_job(conn, moved.job_id)
        return ActionResult(moved)


async def _locked(conn: Connection, task_id: str) -> tasks_repo.Task:
    task = await tasks_repo.lock(conn, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return task


async def _check_job_not_cancelled(conn: Connection, job_id: str, action: TaskAction) -> None:
    """A task of a cancelled job would never be released again: refuse to bring it back (nor
    a purged job's: its data is gone)."""
    await harvest.check_not_purged(conn, job_id, f"{action.value} a task of it")
    state = await conn.fetchval("SELECT state FROM jobs WHERE id = $1", job_id)
    if state == JobState.CANCELLED.value:
        raise Conflict(
            f"cannot {action.value} a task of job {job_id}: the job is cancelled",
            next_step="a cancelled job stays so; submit a new job to run its inputs again",
        )


async def _check_test_still_configuring(conn: Connection, task: tasks_repo.Task) -> None:
    """A test task can be acted on only while its job is configuring
    (`shared.operations.configuring`)."""
    if not task.test:
        return
    state = await conn.fetchval("SELECT state FROM jobs WHERE id = $1", task.job_id)
    if state != JobState.CONFIGURING.value:
        raise Conflict(
            f"task {task.id} is a test run of job {task.job_id}, which is {state} now;"
            " its outputs were discarded at activation",
            next_step=f"act on the job's own tasks (`vigil status {task.job_id}` lists them)",
        )


async def _move(
    conn: Connection, task: tasks_repo.Task, step: Plan, action: TaskAction, actor: str
) -> tasks_repo.Task:
    assert step.target is not None
    changes: dict[str, Any] = {"claim": None, "worker": None}
    if action is TaskAction.CANCEL:
        brief = f"cancelled by {actor}"
        changes |= {"failure_class": FailureClass.CANCELLED, "error_brief": brief}
        await kill_running(conn, task, brief)
        await attempts_repo.close_open(
            conn, task.id, S.TERMINATED.value, FailureClass.CANCELLED, brief
        )
    elif task.state in FAILED and not step.hook:
        changes |= tasks_repo.CLEAR_FAILURE
    if step.target in QUIET:
        await outbox.wake_round(conn)
    try:
        return await tasks_repo.transition(
            conn, task.id, step.target, among=frozenset({task.state}), changes=changes
        )
    except StaleState as exc:  # the row is locked: only a bug can get here
        raise Conflict(str(exc), next_step="look at the task again, then retry") from exc


async def kill_running(conn: Connection, task: tasks_repo.Task, reason: str) -> None:
    """Ask the task's supervisor to kill its process (KillTask through the outbox), if it has
    one running; `task` is the row as read before its transition."""
    if task.state is not S.ON_CPU or task.pid is None or task.host is None:
        return
    process = tasks_repo.Process(task.id, task.pid, task.host, task.pid_create_time, task.claim)
    await outbox.add_work_many(conn, [kill_order(task.job_id, process, reason)])


def kill_order(job_id: str, process: tasks_repo.Process, reason: str) -> tuple[str, KillTask]:
    """The `KillTask` (and its routing key) for a task's running process."""
    kill = KillTask(
        job_id=job_id,
        task_id=process.task_id,
        pid=process.pid,
        create_time=process.create_time or 0.0,
        reason=reason,
        claim=process.claim,
    )
    return supervise_key(process.host), kill


async def duplicate(conn: Connection, task: tasks_repo.Task) -> tasks_repo.Task:
    """A new task of the same job with the same input (new id, new work dir), at `new`."""
    [new_id] = await jobs_repo.append_tasks(conn, task.job_id, [task.input], test=task.test)
    await prerequisites_repo.copy(conn, task.id, new_id)
    await reopen_job(conn, task.job_id)
    created = await tasks_repo.get(conn, new_id)
    assert created is not None
    return created


async def reopen_job(conn: Connection, job_id: str) -> None:
    """A finished job with work to do again becomes `active` (no-op otherwise).

    The job row is locked, like the finaliser does, so that the two are serialised; a job
    purged meanwhile (its lock was waited for) is refused here.
    """
    state = await jobs_repo.lock_state(conn, job_id)
    await harvest.check_not_purged(conn, job_id, "reopen it")
    if state in (JobState.COMPLETED.value, JobState.FAILED.value):
        await jobs_repo.transition(conn, job_id, JobState.ACTIVE)
        await stop_guard.hold_if_stopped(conn, job_id)


async def apply_to_job(
    conn: Connection,
    job_id: str,
    action: JobAction,
    actor: str,
    *,
    max_in_flight: int | None = None,
    release_per_tick: int | None = None,
) -> jobs_repo.Job:
    """Apply a job action; raises `NotFound` or `Conflict`. One transaction, tried again
    (up to `JOB_ACTION_TRIES` in all) when PostgreSQL aborts it for a deadlock. A purge only
    marks the job purged here: the caller clears its data once this committed
    (`harvest.clear_purged`, in batches)."""
    for tries_left in reversed(range(JOB_ACTION_TRIES)):
        try:
            return await _apply_to_job_once(
                conn,
                job_id,
                action,
                actor,
                max_in_flight=max_in_flight,
                release_per_tick=release_per_tick,
            )
        except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError) as exc:
            if not tries_left:
                raise
            logger.info("%s of job %s lost a race, tried again: %s", action.value, job_id, exc)
    raise AssertionError("unreachable")


async def _apply_to_job_once(
    conn: Connection,
    job_id: str,
    action: JobAction,
    actor: str,
    *,
    max_in_flight: int | None,
    release_per_tick: int | None,
) -> jobs_repo.Job:
    async with conn.transaction():
        await stop_guard.share(conn)  # first: it may resume or reopen the job (see stop_guard)
        state = await jobs_repo.lock_state(conn, job_id)
        if state is None:
            raise NotFound(f"no job {job_id}")
        current = JobState(state)
        if action is not JobAction.PURGE:
            await harvest.check_not_purged(conn, job_id, f"{action.value} it")
        if action is JobAction.PURGE:
            await harvest.mark_purged(conn, job_id, actor, "purge action")
        elif action is JobAction.THROTTLE:
            await _throttle(conn, job_id, max_in_flight, release_per_tick)
        elif action is JobAction.RECOVER_FAILED:
            await _recover_failed(conn, job_id, current)
        else:
            await _set_job_state(conn, job_id, current, action, actor)
        job = await jobs_repo.get(conn, job_id)
        assert job is not None
        return job


_JOB_TARGET = {
    JobAction.CANCEL: JobState.CANCELLED,
    JobAction.SUSPEND: JobState.SUSPENDED,
    JobAction.RESUME: JobState.ACTIVE,
}
_JOB_ALLOWED = {
    JobAction.CANCEL: (JobState.CONFIGURING, JobState.ACTIVE, JobState.SUSPENDED),
    JobAction.SUSPEND: (JobState.ACTIVE,),
    JobAction.RESUME: (JobState.SUSPENDED,),
}


def job_next_step(job_id: str, current: JobState, action: JobAction) -> str:
    """What can be done with a job in `current` state, for a refusal of `action`."""
    if action is JobAction.RESUME and current is JobState.ACTIVE:
        return "it is running already: nothing to resume"
    if action is JobAction.SUSPEND and current is JobState.SUSPENDED:
        return f"it is suspended already; resume it with `vigil resume {job_id}`"
    if action is JobAction.CANCEL and current in (JobState.COMPLETED, JobState.FAILED):
        return f"it has ended: nothing runs (`vigil purge {job_id}` deletes its data)"
    if current in (JobState.COMPLETED, JobState.FAILED):
        return (
            f"it has ended: recover its failed tasks (`vigil recover {job_id}`), or append"
            " inputs to run more"
        )
    if current is JobState.CANCELLED:
        return "a cancelled job stays so; submit it again to run it again"
    if current is JobState.SUSPENDED:
        return f"resume it (`vigil resume {job_id}`), or cancel it (`vigil cancel {job_id}`)"
    if current is JobState.CONFIGURING:
        return f"activate it first (`vigil activate {job_id}`), or cancel it"
    return f"it is running: suspend it (`vigil suspend {job_id}`) or cancel it"


async def _set_job_state(
    conn: Connection, job_id: str, current: JobState, action: JobAction, actor: str
) -> None:
    if current not in _JOB_ALLOWED[action]:
        allowed = ", ".join(s.value for s in _JOB_ALLOWED[action])
        raise Conflict(
            f"cannot {action.value} a job in state {current.value}; allowed in: {allowed}",
            next_step=job_next_step(job_id, current, action),
        )
    if action is JobAction.RESUME:
        await stop_guard.refuse_if_stopped(conn, f"resume job {job_id}")
    target = _JOB_TARGET[action]
    event = None
    if target is JobState.CANCELLED:
        brief = f"cancelled by {actor}"
        event = JobEvent(job_id=job_id, outcome=JobOutcome.CANCELLED, brief=brief)
        running = await tasks_repo.cancel_job(conn, job_id, brief)
        await outbox.add_work_many(conn, [kill_order(job_id, p, brief) for p in running])
    await jobs_repo.transition(conn, job_id, target, event)
    if action in (JobAction.SUSPEND, JobAction.RESUME):
        await _freeze_running(conn, job_id, frozen=action is JobAction.SUSPEND)


async def _freeze_running(conn: Connection, job_id: str, *, frozen: bool) -> None:
    """Ask the supervisors to stop (or continue) the job's running commands."""
    rows = await conn.fetch(
        "SELECT * FROM tasks WHERE job_id = $1 AND state = 'on_cpu' AND pid IS NOT NULL"
        " AND host IS NOT NULL",
        job_id,
    )
    for task in map(tasks_repo.Task.from_record, rows):
        assert task.pid is not None and task.host is not None
        freeze = FreezeTask(
            job_id=job_id,
            task_id=task.id,
            pid=task.pid,
            create_time=task.pid_create_time or 0.0,
            claim=task.claim,
            frozen=frozen,
        )
        await outbox.add_work(conn, supervise_key(task.host), freeze)


async def _recover_failed(conn: Connection, job_id: str, current: JobState) -> None:
    """Every failed task of the job moves as a `recover` of it would, in one statement."""
    if current is JobState.CANCELLED:
        raise Conflict(
            f"cannot recover a task of job {job_id}: the job is cancelled",
            next_step="a cancelled job stays so; submit a new job to run its inputs again",
        )
    moved = await tasks_repo.move_job_tasks(
        conn, job_id, targets(TaskAction.RECOVER), keeps_failure=frozenset(ACTIONS)
    )
    if not moved:
        raise Conflict(
            f"job {job_id} has no failed task to recover",
            next_step=f"nothing to do (`vigil status {job_id}` shows its tasks)",
        )
    await outbox.wake_round(conn)  # some may rest in a quiet state (`data_ready`)
    await reopen_job(conn, job_id)


async def _throttle(
    conn: Connection,
    job_id: str,
    max_in_flight: int | None,
    release_per_tick: int | None,
) -> None:
    if max_in_flight is None and release_per_tick is None:
        raise Conflict(
            "throttle needs max_in_flight and/or release_per_tick",
            next_step="give one of them, or both",
        )
    await jobs_repo.throttle(conn, job_id, max_in_flight, release_per_tick)
