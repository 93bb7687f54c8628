"""Resubmission (design §5): a failed task stays failed, and a clone carries on in its place.

The clone is a new task of the same job with the same input and the same index (the index
names the input, the lineage the try), `resubmitted_from` the original, which gets
`superseded_by` the clone. Every prerequisite that named the original now names the clone
(lineage), so tasks waiting on it survive the retry; the clone waits on what the original
waited on. A superseded task is history, not work: it no longer counts towards its job's
outcome nor among its tasks per state, and no action runs it again (`refuse_superseded`).
"""

from typing import Final

from shared.domain.actions import TaskAction, runs_again
from shared.domain.errors import Conflict
from shared.domain.states import FAILED
from shared.store import jobs_repo, prerequisites_repo, tasks_repo
from shared.store.db import Connection

#: The triage's own resubmissions: a refused one is left as it is.
_LEFT: Final = "the task is left as it is"


async def resubmit(conn: Connection, task_id: str) -> tasks_repo.Task:
    """Clone failed task `task_id` at `new`; returns the clone. One transaction.

    Raises `Conflict` when the task is not failed or was already resubmitted.
    """
    async with conn.transaction():
        original = await tasks_repo.lock(conn, task_id)
        if original is None:
            raise Conflict(f"no task {task_id}", next_step=_LEFT)
        if original.state not in FAILED or original.superseded_by is not None:
            raise Conflict(
                f"task {task_id} ({original.state}) cannot be resubmitted", next_step=_LEFT
            )
        clone_id = await jobs_repo.add_clone(conn, original.job_id, task_id)
        await tasks_repo.link_clone(conn, task_id, clone_id, original.infra_retries + 1)
        await prerequisites_repo.copy(conn, task_id, clone_id)
        await prerequisites_repo.move_to_clone(conn, task_id, clone_id)
        clone = await tasks_repo.get(conn, clone_id)
        assert clone is not None
        return clone


async def refuse_superseded(conn: Connection, task: tasks_repo.Task, action: TaskAction) -> None:
    """Raise `Conflict` when `action` would make `task` work again although a resubmitted
    clone carries its input on: the refusal names the last task of its lineage (a task can be
    resubmitted several times), and that task's state. Running the superseded task too would
    run its input twice. `cancel` is left to the state table (a superseded task rests failed)."""
    if task.superseded_by is None or not runs_again(action):
        return
    latest = await tasks_repo.latest_of_lineage(conn, task.id)
    assert latest is not None  # `task` exists, and so does every task of its lineage
    raise Conflict(
        f"cannot {action.value} task {task.id}: it was resubmitted, and its input runs on as"
        f" task {latest.id} ({latest.state.value})",
        next_step=f"act on {latest.id} instead (`vigil status {latest.id}`); {task.id} is kept"
        " as history",
    )
