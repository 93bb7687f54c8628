"""Prerequisites between tasks (`task_prerequisites`, design §4): every write to the table
lives here. Inserts take no lock beyond their rows (a duplicate is ignored); the lineage update
holds the row locks of the prerequisites it moves until the caller's transaction ends.
"""

from shared.store.db import Connection


async def add(conn: Connection, rows: list[tuple[str, str, str, str]]) -> None:
    """(task, stage, on task, required state) each; one already there is left as it is.
    Locks: none beyond the rows it inserts, plus key-share locks on both tasks' rows (foreign
    keys)."""
    await conn.executemany(
        "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        rows,
    )


async def copy(conn: Connection, from_task: str, to_task: str) -> None:
    """`to_task` waits on what `from_task` waits on (a duplicate, a resubmission's clone).
    Locks: none beyond the rows it inserts, plus key-share locks on the task rows they name
    (foreign keys); `from_task`'s rows are read, not locked."""
    await conn.execute(
        "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
        " SELECT $2, stage, on_task_id, required FROM task_prerequisites WHERE task_id = $1",
        from_task,
        to_task,
    )


async def move_to_clone(conn: Connection, task_id: str, clone_id: str) -> None:
    """Lineage: every prerequisite on `task_id` is on its clone from now on. Locks: each
    prerequisite row on `task_id` (its UPDATE), plus a key-share lock on the clone's row."""
    await conn.execute(
        "UPDATE task_prerequisites SET on_task_id = $2 WHERE on_task_id = $1", task_id, clone_id
    )
