"""Reads of why waiting tasks wait (issue 39): a job's `job_waits` row, which the leading
scheduler's planning round writes, how many of its tasks wait to be placed, and a task's setup
prerequisites with the state of each task they name. The api's `waiting` and
`waiting_reason` are decided from these by `shared.domain.waiting`.

Locks: none (reads).
"""

from typing import Final

from shared.domain.states import TaskState
from shared.domain.waiting import Prerequisite, StoredWait
from shared.store.db import Connection


async def job_wait(conn: Connection, job_id: str) -> StoredWait | None:
    """The job's `job_waits` row, or None."""
    row = await conn.fetchrow(
        "SELECT reason, message, detail, at FROM job_waits WHERE job_id = $1", job_id
    )
    if row is None:
        return None
    detail = row["detail"] if isinstance(row["detail"], dict) else {}
    return StoredWait(row["reason"], row["message"], detail, row["at"])


#: The job's new tasks not yet claimed, counted on the partial index `tasks_new`
#: (`(job_id, index) WHERE claim IS NULL AND state = 'new'`, migration 0011): a count on
#: what waits, never a read of the tasks that ran. A configuring job's waiting tasks
#: are its test tasks (negative indexes); an active job's test tasks never run, so its own
#: (index 0 and up) are counted.
_WAITING_OWN: Final = (
    "SELECT count(*) FROM tasks WHERE job_id = $1 AND claim IS NULL AND state = 'new'"
    " AND index >= 0"
)
_WAITING_TESTS: Final = (
    "SELECT count(*) FROM tasks WHERE job_id = $1 AND claim IS NULL AND state = 'new' AND index < 0"
)


async def waiting_tasks(conn: Connection, job_id: str, *, tests: bool = False) -> int:
    """How many of the job's tasks are `new` and unclaimed: its own, or its test tasks."""
    return int(await conn.fetchval(_WAITING_TESTS if tests else _WAITING_OWN, job_id))


async def setup_prerequisites(conn: Connection, task_id: str) -> list[Prerequisite]:
    """The task's setup prerequisites, each with the state of the task it names, in order."""
    rows = await conn.fetch(
        "SELECT p.on_task_id, p.required, o.state::text AS state, o.decided"
        " FROM task_prerequisites p JOIN tasks o ON o.id = p.on_task_id"
        " WHERE p.task_id = $1 AND p.stage = 'setup' ORDER BY p.on_task_id",
        task_id,
    )
    return [
        Prerequisite(r["on_task_id"], r["required"], TaskState(r["state"]), r["decided"])
        for r in rows
    ]
