"""`fail_fast`: the first failure fails the whole job and revokes the rest of its work.

Every task of the job that has not ended is cancelled: waiting tasks are `terminated`, running
ones are killed through their supervisor. Work messages already queued for them become no-ops,
since their claim no longer matches (every consumer's compare-and-set fails). The finaliser
then ends the job `failed` and purges its Redis keys.
"""

from shared.domain.actions import TaskAction
from shared.domain.states import TERMINAL
from shared.operations import task_actions
from shared.store.db import Connection


async def revoke_job(conn: Connection, job_id: str, cause: str) -> int:
    """Cancel every unfinished task of `job_id` because of `cause`; returns how many."""
    rows = await conn.fetch(
        "SELECT id FROM tasks WHERE job_id = $1 AND state <> ALL($2::task_state[]) ORDER BY index",
        job_id,
        sorted(s.value for s in TERMINAL),
    )
    for row in rows:
        await task_actions.apply_to_task(conn, row["id"], TaskAction.CANCEL, cause)
    return len(rows)
