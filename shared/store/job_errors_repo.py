"""Errors kept with their job (`job_errors`): the error-severity log records that failed a
task, and the scheduler's dead letters. Every write to the table lives here; an insert takes
no lock beyond its own row and the key-share locks of its foreign keys (the job's and the
task's rows).

When a task fails as `error_log`, every record of its attempt whose severity is in the job's
`fail_on_log` is copied here, each with the lines that led up to it as its detail.
"""

from dataclasses import dataclass
from datetime import datetime

from shared.domain.messages import Severity
from shared.store.db import Connection

_CONTEXT_LINES = 10


@dataclass(frozen=True)
class JobError:
    id: int
    job_id: str
    task_id: str
    ts: datetime
    severity: str
    brief: str
    detail: str | None


async def record_from_logs(
    conn: Connection, job_id: str, task_id: str, attempt: int, severities: list[Severity]
) -> int:
    """Copy the attempt's error records (not already kept) to `job_errors`; returns how many.
    Locks: none beyond the rows it inserts, plus key-share locks on the job's and the task's
    rows (foreign keys); the `logs` it copies are read, not locked."""
    status = await conn.execute(
        "INSERT INTO job_errors (job_id, task_id, ts, severity, brief, detail)"
        " SELECT $1, l.task_id, l.ts, l.severity, left(l.line, 1000),"
        "  (SELECT string_agg(c.line, E'\\n' ORDER BY c.line_no) FROM logs c"
        "   WHERE c.task_id = l.task_id AND c.attempt = l.attempt"
        "   AND c.line_no BETWEEN l.line_no - $5 AND l.line_no)"
        " FROM logs l WHERE l.task_id = $2 AND l.attempt = $3 AND l.severity = ANY($4)"
        " AND NOT EXISTS (SELECT 1 FROM job_errors e WHERE e.task_id = l.task_id"
        "   AND e.ts = l.ts AND e.brief = left(l.line, 1000))"
        " ORDER BY l.line_no",
        job_id,
        task_id,
        attempt,
        [s.value for s in severities],
        _CONTEXT_LINES,
    )
    return int(status.split()[-1])


async def record(
    conn: Connection, job_id: str | None, task_id: str, severity: str, brief: str, detail: str
) -> None:
    """Keep one error with its job (a dead-lettered message's, `services/scheduler`).
    Locks: none beyond the row it inserts, plus key-share locks on the job's and the task's
    rows (foreign keys)."""
    await conn.execute(
        "INSERT INTO job_errors (job_id, task_id, severity, brief, detail)"
        " VALUES ($1, $2, $3, $4, $5)",
        job_id,
        task_id,
        severity,
        brief,
        detail,
    )


async def first_error(
    conn: Connection, task_id: str, attempt: int, severities: list[Severity]
) -> str | None:
    """The first persisted line of the attempt with a severity in `severities`, if any."""
    line: str | None = await conn.fetchval(
        "SELECT line FROM logs WHERE task_id = $1 AND attempt = $2 AND severity = ANY($3)"
        " ORDER BY line_no LIMIT 1",
        task_id,
        attempt,
        [s.value for s in severities],
    )
    return line


async def list_for_job(conn: Connection, job_id: str, limit: int = 100) -> list[JobError]:
    """The job's kept errors, oldest first (at most `limit`)."""
    rows = await conn.fetch(
        "SELECT * FROM job_errors WHERE job_id = $1 ORDER BY id LIMIT $2", job_id, limit
    )
    return [JobError(**dict(r)) for r in rows]
