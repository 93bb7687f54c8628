"""Given-steps of the harvest and purge tests (holds no tests): ended jobs whose tasks ran on
a host, with log lines and recorded outputs, written with plain SQL and the repositories."""

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from shared.domain.messages import LogRecord, Severity
from shared.objects import ObjectStore, keys
from shared.store import logs_repo, outputs_repo
from shared.store.db import Connection
from shared.task_types.base import OutputRecord

HOST = "h-harvest"


async def task_ids(conn: Connection, job_id: str) -> list[str]:
    rows = await conn.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job_id)
    return [r["id"] for r in rows]


async def end(
    conn: Connection, job_id: str, job_state: str = "completed", *, ago_s: float = 0.0, **task: Any
) -> list[str]:
    """End the job `ago_s` seconds ago with every task `completed` (or `task["state"]`) on
    `HOST` in a work dir of its own; returns the task ids."""
    await conn.execute(
        "UPDATE jobs SET state = $2, finished_at = now() - make_interval(secs => $3) WHERE id = $1",
        job_id,
        job_state,
        ago_s,
    )
    ids = await task_ids(conn, job_id)
    for task_id in ids:
        await put(
            conn,
            task_id,
            **(
                {
                    "state": "completed",
                    "claim": None,
                    "host": HOST,
                    "workdir": f"/w/{job_id}/{task_id}",
                }
                | task
            ),
        )
    return ids


async def put(conn: Connection, task_id: str, **columns: Any) -> None:
    """Force columns of a task (bypassing the transition table)."""
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
    await conn.execute(f"UPDATE tasks SET {sets} WHERE id = $1", task_id, *columns.values())


async def record(
    conn: Connection,
    task_id: str,
    name: str,
    data: bytes,
    *,
    store: ObjectStore | None = None,
    kept: bool = True,
    run_number: int = 1,
) -> OutputRecord:
    """Record output `name` of the task's run holding `data`: put in `store` as the worker
    does (none: recorded as before outputs went to the store), its bytes kept or not."""
    digest = hashlib.sha256(data).hexdigest()
    key = None
    if store is not None:
        job_id = await conn.fetchval("SELECT job_id FROM tasks WHERE id = $1", task_id)
        key = keys.output_key(job_id, task_id, run_number, name)
        with tempfile.TemporaryDirectory() as scratch:
            source = Path(scratch) / "output"
            source.write_bytes(data)
            await store.put_file(key, source)
    out = OutputRecord(
        name,
        f"/w/{task_id}/{name}",
        len(data),
        digest,
        data if kept else None,
        None if kept else "over the 1 MiB download limit",
        key,
    )
    await outputs_repo.save(conn, task_id, run_number, HOST, [out])
    return out


async def log_lines(conn: Connection, job_id: str, task_id: str, count: int = 3) -> None:
    """Store `count` log lines of the task."""
    await logs_repo.insert(
        conn,
        [
            LogRecord(
                job_id=job_id,
                task_id=task_id,
                run_number=1,
                attempt=1,
                line_no=i,
                severity=Severity.INFO,
                stream="stdout",
                line=f"line {i}",
            )
            for i in range(count)
        ],
    )


async def logs_of(conn: Connection, job_id: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM logs WHERE job_id = $1", job_id))


async def kept_bytes(conn: Connection, job_id: str) -> int:
    """How many outputs of the job still have their bytes."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM task_outputs o JOIN tasks t ON t.id = o.task_id"
            " WHERE t.job_id = $1 AND o.content IS NOT NULL",
            job_id,
        )
    )


async def outbox_of(conn: Connection, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(routing key, body) of the outbox rows about the job, in order."""
    rows = await conn.fetch(
        "SELECT routing_key, body FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", job_id
    )
    return [(r["routing_key"], r["body"]) for r in rows]
