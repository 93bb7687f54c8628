"""Try before production: a job's configuring phase, its test runs, and its activation.

A job submitted with `configuring` holds its inputs (`jobs.inputs`) and has no task of its
own. Each `test` action makes one *test task* (`tasks.test`, indexes -1, -2, ...) from one of
the held inputs, from an upstream task of a chained job, or from an explicit test input; the
dispatcher releases test tasks of configuring jobs like any other. The job's prerequisites are
not applied to test tasks: a test tries the command now.

`activate` (one transaction, the job row locked): test tasks still running are cancelled, the
test outputs are thrown away (their `task_outputs` rows deleted, their work dirs removed by the
workers), the job goes `configuring -> active` with `job.activated`, and its tasks are made
from the held inputs (or chained from its upstream job). Test tasks stay in the job as a
record but never count towards its outcome, and cannot be acted on once it is active.
"""

from dataclasses import dataclass
from typing import Any

from shared.domain.actions import TaskAction
from shared.domain.errors import Conflict, NotFound
from shared.domain.messages import JobEvent, JobOutcome
from shared.domain.states import TERMINAL, JobState
from shared.operations import datasets, harvest, stop_guard, task_actions
from shared.store import jobs_repo, outputs_repo, tasks_repo
from shared.store.db import Connection


@dataclass(frozen=True)
class TrialInput:
    """What a test runs on: the held input at `index` (a chained job: the upstream task at that
    position), or `value` itself when `explicit`."""

    index: int = 0
    value: Any = None
    explicit: bool = False


async def start_test(conn: Connection, job_id: str, what: TrialInput) -> tasks_repo.Task:
    """Make one test task of configuring job `job_id`; raises `NotFound` or `Conflict`."""
    async with conn.transaction():
        job = await _locked_configuring(conn, job_id, "run a test of")
        upstream: str | None = None
        if what.explicit:
            value = what.value
        elif job.inputs_from is not None:
            upstream = await _upstream_at(conn, job, what.index)
            value = {datasets.UPSTREAM_KEY: upstream}
        else:
            value = _held_at(job, what.index)
        [task_id] = await jobs_repo.append_tasks(conn, job_id, [value], test=True)
        if upstream is not None:
            await datasets.promise(conn, [task_id], [upstream])
        task = await tasks_repo.get(conn, task_id)
        assert task is not None  # made above
        return task


async def activate(conn: Connection, job_id: str, actor: str) -> tuple[jobs_repo.Job, int]:
    """Put configuring job `job_id` into production; (the job, how many tasks it got).

    Raises `NotFound` or `Conflict` (not configuring). One transaction.
    """
    async with conn.transaction():
        await stop_guard.share(conn)  # before any row lock: a stop waits, or is seen
        job = await _locked_configuring(conn, job_id, "activate")
        tests = await tasks_repo.lock_tests_of_job(conn, job_id)
        for task in tests:
            if task.state not in TERMINAL:
                await task_actions.apply_to_task(
                    conn, task.id, TaskAction.CANCEL, f"{actor} (job activated)"
                )
        await outputs_repo.delete_of_tasks(conn, [t.id for t in tests])
        await harvest.remove_workdirs(conn, tests, "test outputs discarded at activation")
        event = JobEvent(job_id=job_id, outcome=JobOutcome.ACTIVATED, brief=f"activated by {actor}")
        await jobs_repo.transition(conn, job_id, JobState.ACTIVE, event)
        await jobs_repo.mark_activated(conn, job_id)
        made: list[str] = []
        if job.inputs_from is not None:
            upstream = await datasets.upstream_task_ids(conn, job.inputs_from)
            made += await datasets.chain(conn, job_id, upstream)
        if job.inputs:  # the held ones (a chained job: those appended or edited in, after)
            made += await datasets.add_tasks(conn, job_id, list(job.inputs))
        await stop_guard.hold_if_stopped(conn, job_id)
        activated = await jobs_repo.get(conn, job_id)
        assert activated is not None
        return activated, len(made)


async def _locked_configuring(conn: Connection, job_id: str, doing: str) -> jobs_repo.Job:
    record = await jobs_repo.lock(conn, job_id)
    if record is None:
        raise NotFound(f"no job {job_id}")
    job = jobs_repo.Job.from_record(record)
    if job.state is not JobState.CONFIGURING:
        raise Conflict(
            f"cannot {doing} job {job_id}: it is {job.state.value}, and only a configuring job"
            " can be tested or activated",
            next_step='submit one with "configuring": true (`vigil submit --configuring`)',
        )
    return job


def _held_at(job: jobs_repo.Job, index: int) -> Any:
    held = job.inputs or []
    if not 0 <= index < len(held):
        raise Conflict(
            f"job {job.id} holds {len(held)} input(s)" if held else f"job {job.id} holds no input",
            next_step=f"give input_index 0 to {len(held) - 1}, or an explicit input"
            if held
            else "give the test an explicit input",
        )
    return held[index]


async def _upstream_at(conn: Connection, job: jobs_repo.Job, index: int) -> str:
    assert job.inputs_from is not None
    upstream = await datasets.task_ids_of(conn, job.inputs_from, superseded=False)
    if not 0 <= index < len(upstream):
        raise Conflict(
            f"job {job.inputs_from} (inputs_from) has {len(upstream)} task(s)"
            if upstream
            else f"job {job.inputs_from} (inputs_from) has no task yet",
            next_step=f"give input_index 0 to {len(upstream) - 1}, or an explicit input"
            if upstream
            else "give the test an explicit input",
        )
    return upstream[index]
