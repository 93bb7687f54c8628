"""Persisted output lines of commands."""

from dataclasses import dataclass
from datetime import datetime
from typing import Final

import asyncpg

from shared.domain.messages import LogRecord
from shared.store.db import Connection


@dataclass(frozen=True)
class StoredLog:
    """One persisted line, with its sequence number in the job's log."""

    seq: int
    ts: datetime
    task_id: str
    run_number: int
    attempt: int
    severity: str
    stream: str
    line: str


async def insert(conn: Connection, records: list[LogRecord]) -> None:
    """Persist lines in the order given; a line already stored (redelivery) is skipped.
    Locks: none beyond the rows it inserts (a line skipped is not locked)."""
    await conn.executemany(
        "INSERT INTO logs (job_id, task_id, run_number, attempt, line_no, ts, severity, stream,"
        " line) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        " ON CONFLICT (task_id, attempt, line_no) DO NOTHING",
        [
            (
                r.job_id,
                r.task_id,
                r.run_number,
                r.attempt,
                r.line_no,
                r.ts,
                r.severity.value,
                r.stream,
                r.line,
            )
            for r in records
        ],
    )


async def insert_splitting(conn: Connection, records: list[LogRecord]) -> list[LogRecord]:
    """`insert`, and when PostgreSQL refuses the batch for what a line holds (a `DataError`),
    the halves again until each refused line is alone: that line is stored as a marker saying
    why (its text stays in the run's log file), so one line never costs its neighbours.
    Returns the lines as stored. (A batch is one statement: all of it lands, or none.)
    Locks: as `insert`, none beyond the rows it inserts."""
    try:
        await insert(conn, records)
    except asyncpg.DataError as exc:
        if len(records) > 1:
            half = len(records) // 2
            return await insert_splitting(conn, records[:half]) + await insert_splitting(
                conn, records[half:]
            )
        marker = records[0].model_copy(update={"line": refused_line(exc)})
        await insert(conn, [marker])
        return [marker]
    return records


def refused_line(exc: Exception) -> str:
    """What is stored in place of a line the database refused."""
    return (
        f"[vigil: this line was refused by the database ({type(exc).__name__});"
        " its text is in the run's log file]"
    )


#: The most bytes of line text one page of a job's log carries (lines are cut at 8,192
#: characters): eight pages of 10,000 long lines at once took the api to 470 MiB.
PAGE_BYTES: Final = 4 * 1024 * 1024


async def for_job(
    conn: Connection,
    job_id: str,
    *,
    task_id: str | None = None,
    run_number: int | None = None,
    severity: str | None = None,
    after: int = 0,
    limit: int = 1000,
    max_bytes: int = PAGE_BYTES,
) -> list[StoredLog]:
    """The job's lines in order, filtered, with `seq` greater than `after`: at most `limit`
    lines, and no more lines once `max_bytes` of text are in (the first always comes)."""
    records = await conn.fetch(
        "SELECT seq, ts, task_id, run_number, attempt, severity, stream, line FROM ("
        " SELECT *, sum(octet_length(line)) OVER (ORDER BY seq) - octet_length(line) AS before"
        " FROM (SELECT seq, ts, task_id, run_number, attempt, severity, stream, line FROM logs"
        "  WHERE job_id = $1 AND seq > $2 AND ($3::text IS NULL OR task_id = $3)"
        "  AND ($4::int IS NULL OR run_number = $4) AND ($5::text IS NULL OR severity = $5)"
        "  ORDER BY seq LIMIT $6) page"
        ") sized WHERE before < $7 ORDER BY seq",
        job_id,
        after,
        task_id,
        run_number,
        severity,
        limit,
        max_bytes,
    )
    return [StoredLog(**dict(r)) for r in records]


async def tail_of_job(
    conn: Connection,
    job_id: str,
    *,
    task_id: str | None = None,
    run_number: int | None = None,
    limit: int = 1000,
) -> list[StoredLog]:
    """The job's last `limit` lines (of one task and run, if given), in order."""
    records = await conn.fetch(
        "SELECT seq, ts, task_id, run_number, attempt, severity, stream, line FROM logs"
        " WHERE job_id = $1 AND ($2::text IS NULL OR task_id = $2)"
        " AND ($3::int IS NULL OR run_number = $3) ORDER BY seq DESC LIMIT $4",
        job_id,
        task_id,
        run_number,
        limit,
    )
    return [StoredLog(**dict(r)) for r in reversed(records)]


async def prune_ended_jobs(conn: Connection, retention_s: float, limit: int = 10_000) -> int:
    """Delete the logs of jobs that ended more than `retention_s` ago (at most `limit` lines per
    call, oldest jobs first, so that a large backlog is pruned in bounded steps). Locks: the
    `logs` rows it deletes; the `jobs` rows it reads are not locked."""
    status = await conn.execute(
        "DELETE FROM logs WHERE seq IN (SELECT l.seq FROM jobs j JOIN logs l ON l.job_id = j.id"
        " WHERE j.finished_at < now() - make_interval(secs => $1)"
        " ORDER BY j.finished_at LIMIT $2)",
        retention_s,
        limit,
    )
    return int(status.split()[-1])


async def delete_batch_of_job(conn: Connection, job_id: str, after: int, limit: int) -> list[int]:
    """Delete up to `limit` of the job's lines past `after` (by `seq`): their seqs (a purge
    goes in such batches, each statement on its own, so that no lock is held long)."""
    gone = await conn.fetch(
        "DELETE FROM logs WHERE seq IN (SELECT seq FROM logs WHERE job_id = $1 AND seq > $2"
        " ORDER BY seq LIMIT $3) RETURNING seq",
        job_id,
        after,
        limit,
    )
    return [r["seq"] for r in gone]
