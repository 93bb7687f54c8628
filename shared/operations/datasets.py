"""Growing datasets and chained jobs (design §6).

A job's inputs can be appended while it lives; a job created with `inputs_from` gets one
promised input per task of the upstream job, each waiting (a setup prerequisite) for its own
upstream task to complete. Inputs appended upstream flow on to every job chained from it.
"""

from typing import Any, Final

from shared.domain.errors import Conflict, NotFound
from shared.domain.prerequisites import Required
from shared.domain.states import JobState
from shared.operations import harvest, stop_guard, task_actions
from shared.store import jobs_repo, prerequisites_repo, tasks_repo
from shared.store.db import Connection

#: The key of a promised input: `{"upstream_task": "<task id>"}`, resolved by the worker.
UPSTREAM_KEY: Final = "upstream_task"
_APPENDABLE: Final = (
    JobState.CONFIGURING,
    JobState.ACTIVE,
    JobState.SUSPENDED,
    JobState.COMPLETED,
    JobState.FAILED,
)


async def add_inputs(conn: Connection, job_id: str, inputs: list[Any]) -> list[str]:
    """Append one task per input to `job_id` (reopening a finished job); returns the new ids.

    A configuring job holds the inputs until it is activated (no task yet: returns []).
    Raises `NotFound` for no such job and `Conflict` for a cancelled one. Chained jobs get
    their promised inputs for the new tasks in the same transaction.
    """
    async with conn.transaction():
        await stop_guard.share(conn)  # first: it may reopen the job (see stop_guard)
        state = await jobs_repo.lock_state(conn, job_id)
        if state is None:
            raise NotFound(f"no job {job_id}")
        if JobState(state) not in _APPENDABLE:
            raise Conflict(
                f"cannot append inputs to a job in state {state}",
                next_step="submit a new job with them (`vigil submit`, or POST /jobs)",
            )
        await harvest.check_not_purged(conn, job_id, "append inputs to it")
        if JobState(state) is JobState.CONFIGURING:
            await jobs_repo.hold_inputs(conn, job_id, inputs)
            return []
        ids = await add_tasks(conn, job_id, inputs)
        await task_actions.reopen_job(conn, job_id)
    return ids


async def add_tasks(conn: Connection, job_id: str, inputs: list[Any]) -> list[str]:
    """In the caller's transaction, with the job row locked: one task per input after the
    job's last, waiting as the job's prerequisites say, chained on to downstream jobs."""
    ids = await jobs_repo.append_tasks(conn, job_id, inputs)
    await apply_job_prerequisites(conn, job_id, ids)
    for downstream in await _chained_from(conn, job_id):
        await chain(conn, downstream, ids)
    return ids


async def chain(conn: Connection, job_id: str, upstream_task_ids: list[str]) -> list[str]:
    """Give `job_id` one promised input per upstream task, each waiting for it to complete."""
    if not upstream_task_ids:
        return []
    promised = [{UPSTREAM_KEY: tid} for tid in upstream_task_ids]
    ids = await jobs_repo.append_tasks(conn, job_id, promised)
    await promise(conn, ids, upstream_task_ids)
    await apply_job_prerequisites(conn, job_id, ids)
    await task_actions.reopen_job(conn, job_id)  # a finished downstream job has work again
    for downstream in await _chained_from(conn, job_id):
        await chain(conn, downstream, ids)
    return ids


async def promise(conn: Connection, task_ids: list[str], upstream_task_ids: list[str]) -> None:
    """Make each task wait (before setup) for its upstream task to complete."""
    await prerequisites_repo.add(
        conn,
        [
            (tid, "setup", up, Required.COMPLETED.value)
            for tid, up in zip(task_ids, upstream_task_ids, strict=True)
        ],
    )


async def upstream_task_ids(conn: Connection, job_id: str) -> list[str]:
    """The last task of each input's lineage of `job_id`, by index (the promised inputs of a
    job chained from it: a task superseded by its resubmitted clone is not one, its clone is).

    Share-locks the job row until the transaction ends: `add_inputs` takes it `FOR UPDATE`,
    so an append upstream either commits before this read or waits for the chained job to
    commit and then chains its new tasks to it. No input is missed either way.
    """
    await jobs_repo.share_lock(conn, job_id)
    return await task_ids_of(conn, job_id, superseded=False)


async def task_ids_of(conn: Connection, job_id: str, *, superseded: bool = True) -> list[str]:
    """The ids of the tasks of `job_id` (test tasks left out), by index (`BY_INDEX`); without
    those superseded by their resubmitted clone unless `superseded`."""
    rows = await conn.fetch(
        "SELECT id FROM tasks WHERE job_id = $1 AND NOT test"
        f" AND ($2 OR superseded_by IS NULL) ORDER BY {tasks_repo.BY_INDEX}",
        job_id,
        superseded,
    )
    return [r["id"] for r in rows]


async def _chained_from(conn: Connection, job_id: str) -> list[str]:
    """Jobs chained from `job_id` that take its new tasks now (a configuring one takes them
    all when it is activated; a purged one no more)."""
    rows = await conn.fetch(
        "SELECT id FROM jobs WHERE inputs_from = $1 AND purged_at IS NULL"
        " AND state NOT IN ('cancelled', 'configuring') ORDER BY created_at",
        job_id,
    )
    return [r["id"] for r in rows]


async def apply_job_prerequisites(conn: Connection, job_id: str, task_ids: list[str]) -> None:
    """Make new tasks of `job_id` wait as the job's submitted `prerequisites` say. Idempotent."""
    spec = await conn.fetchval("SELECT prerequisites FROM jobs WHERE id = $1", job_id) or {}
    rows = [
        (tid, stage, on_task, required)
        for stage, wanted in spec.items()
        for on_task, required in wanted.items()
        for tid in task_ids
    ]
    if rows:
        await prerequisites_repo.add(conn, rows)
