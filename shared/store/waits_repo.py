"""Reads of why waiting tasks wait: a job's `job_waits` row, which the leading
scheduler's planning round writes, how many of its new tasks are placed (the rest wait), and a
task's setup prerequisites with the state of each task they name. The api's `waiting` and
`waiting_reason` are decided from these by `shared.domain.waiting`.

Locks: none (reads).
"""

from typing import Final

from shared.domain.states import TaskState
from shared.domain.waiting import Prerequisite, StoredWait
from shared.store import sql_states
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


#: The job's `new` tasks that are claimed (placed on a host, not yet set up), counted on the
#: partial index `tasks_in_flight` (migration 0011): what a round placed, never more than the
#: job may have in flight, so that a job of 100,000 waiting tasks costs no read of them (a
#: count of those waiting on `tasks_new` took 12 ms there). Its own tasks (index 0 and up),
#: or its test tasks (negative indexes).
_PLACED: Final = (
    "SELECT count(*) FROM tasks WHERE job_id = $1 AND claim IS NOT NULL AND state = 'new'"
    f" AND (claim IS NOT NULL OR state NOT IN {sql_states.NOT_IN_FLIGHT})"
    " AND (index < 0) = $2"
)


async def placed_tasks(conn: Connection, job_id: str, *, tests: bool = False) -> int:
    """How many of the job's `new` tasks are claimed (placed): its own, or its test tasks.
    Those waiting to be placed are its `new` tasks (`jobs_repo.counts`) less these."""
    return int(await conn.fetchval(_PLACED, job_id, tests))


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
