"""Task outputs: the recorded result files that chained jobs consume (design §6), listed and
downloaded through the api: each is in the object store under its `object_key` (put there by
the worker before its task completed); a small one's bytes are also kept here, for chained
tasks on other hosts (`TaskContext.record_output`)."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.domain.outputs import OutputRecord
from shared.store.db import Connection


async def save(
    conn: Connection, task_id: str, run_number: int, host: str, records: list[OutputRecord]
) -> int:
    """Find or create each record for this run (a repeated save updates it), with the bytes
    the worker kept (or why it did not); how many more bytes are recorded in the object store
    than before (the records' with an `object_key`, less those they replace), which the
    owner's quota counts (`quota_repo.charge_job`). Locks: each output row it inserts or
    updates (the upsert locks a row it meets), plus a key-share lock on the task's row
    (foreign key)."""
    replaced = await conn.fetchval(
        "SELECT coalesce(sum(size), 0) FROM (SELECT size FROM task_outputs WHERE task_id = $1"
        " AND run_number = $2 AND name = ANY($3) AND object_key IS NOT NULL FOR UPDATE) o",
        task_id,
        run_number,
        [r.name for r in records],
    )
    await conn.executemany(
        "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256, content,"
        " not_kept, object_key) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        " ON CONFLICT (task_id, run_number, name)"
        " DO UPDATE SET path = EXCLUDED.path, host = EXCLUDED.host, size = EXCLUDED.size,"
        " sha256 = EXCLUDED.sha256, content = EXCLUDED.content, not_kept = EXCLUDED.not_kept,"
        " object_key = EXCLUDED.object_key",
        [
            (
                task_id,
                run_number,
                r.name,
                r.path,
                host,
                r.size,
                r.sha256,
                r.content,
                r.not_kept,
                r.object_key,
            )
            for r in records
        ],
    )
    return sum(r.size for r in records if r.object_key is not None) - int(replaced)


async def latest(conn: Connection, task_id: str) -> dict[str, dict[str, Any]]:
    """The outputs of the task's latest run that recorded any, by name."""
    rows = await conn.fetch(
        "SELECT name, path, host, size, sha256, not_kept, object_key FROM task_outputs"
        " WHERE task_id = $1"
        " AND run_number = (SELECT max(run_number) FROM task_outputs WHERE task_id = $1)"
        " ORDER BY name",
        task_id,
    )
    return {r["name"]: dict(r) for r in rows}


async def kept(conn: Connection, task_id: str, names: list[str]) -> dict[str, bytes]:
    """The bytes kept of the named outputs of the task's latest run that recorded any (an
    output whose bytes were not kept is absent)."""
    rows = await conn.fetch(
        "SELECT name, content FROM task_outputs WHERE task_id = $1 AND name = ANY($2)"
        " AND content IS NOT NULL"
        " AND run_number = (SELECT max(run_number) FROM task_outputs WHERE task_id = $1)",
        task_id,
        names,
    )
    return {r["name"]: r["content"] for r in rows}


@dataclass(frozen=True)
class StoredOutput:
    """One recorded output as listed: its task, run, where it is and whether its bytes are
    kept for download (`not_kept` says why not)."""

    task_id: str
    index: int
    run_number: int
    name: str
    path: str
    host: str | None
    size: int
    sha256: str
    kept: bool
    not_kept: str | None
    created_at: datetime
    #: Its key in the object store (None: recorded before outputs were put there).
    object_key: str | None = None


_COLUMNS = (
    "t.id AS task_id, t.index, o.run_number, o.name, o.path, o.host, o.size, o.sha256,"
    " o.content IS NOT NULL AS kept, o.not_kept, o.created_at, o.object_key"
)
#: Only the outputs of each task's latest run that recorded any.
_LATEST_RUN = "o.run_number = (SELECT max(m.run_number) FROM task_outputs m WHERE m.task_id = t.id)"


async def for_job(
    conn: Connection, job_id: str, *, after: tuple[int, str] | None, limit: int
) -> list[StoredOutput]:
    """The outputs of the latest run of each task of `job_id` that is not superseded, by
    (task index, name), keyset-paginated strictly after `after`."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM tasks t JOIN task_outputs o ON o.task_id = t.id"
        f" WHERE t.job_id = $1 AND t.superseded_by IS NULL AND {_LATEST_RUN}"
        " AND ($2::integer IS NULL OR (t.index, o.name) > ($2, $3::text))"
        " ORDER BY t.index, o.name LIMIT $4",
        job_id,
        after[0] if after else None,
        after[1] if after else None,
        limit,
    )
    return [StoredOutput(**dict(r)) for r in rows]


async def one(
    conn: Connection, task_id: str, name: str
) -> tuple[StoredOutput, bytes | None] | None:
    """Output `name` of the task's latest run that recorded any, with its kept bytes (None
    when they were not kept or were purged); None when there is no such output."""
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS}, o.content FROM tasks t JOIN task_outputs o ON o.task_id = t.id"
        f" WHERE t.id = $1 AND o.name = $2 AND {_LATEST_RUN}",
        task_id,
        name,
    )
    if row is None:
        return None
    data = dict(row)
    content = data.pop("content")
    return StoredOutput(**data), content


async def drop_contents(conn: Connection, task_ids: list[str]) -> str:
    """Drop the kept bytes of the tasks' outputs (their records stay); the statement's status.
    Locks: the output rows whose bytes it drops (its UPDATE); not the task rows."""
    return await conn.execute(
        "UPDATE task_outputs SET content = NULL"
        " WHERE task_id = ANY($1::text[]) AND content IS NOT NULL",
        task_ids,
    )


async def delete_of_tasks(conn: Connection, task_ids: list[str]) -> None:
    """Forget the outputs of the tasks (test runs' outputs at activation). Locks: the output
    rows it deletes; not the task rows."""
    await conn.execute("DELETE FROM task_outputs WHERE task_id = ANY($1::text[])", task_ids)
