"""Writing a submission's prerequisites (design §4) as `task_prerequisites` rows.

A new job can only name tasks that already exist, so a submission can never close a cycle.
"""

from services.api.schemas import Prerequisites
from shared.db import Connection


async def insert_for_job(conn: Connection, job_id: str, spec: Prerequisites) -> int:
    """Make every task of `job_id` wait as `spec` says; returns the number of rows per task.

    Run it in the transaction that created the job's tasks. Idempotent (existing rows are kept).
    """
    rows = [("setup", on, required) for on, required in spec.setup.items()]
    rows += [("post_processing", on, required) for on, required in spec.post_processing.items()]
    if rows:
        await conn.executemany(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " SELECT t.id, $2, $3, $4 FROM tasks t WHERE t.job_id = $1"
            " ON CONFLICT (task_id, stage, on_task_id) DO NOTHING",
            [(job_id, stage, on, required) for stage, on, required in rows],
        )
    return len(rows)
