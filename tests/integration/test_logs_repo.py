"""Storing a command's lines: a line the database refuses costs only itself."""

import uuid

import pytest

from shared.domain.messages import LogRecord, Severity
from shared.store import jobs_repo, logs_repo, users_repo
from shared.store.db import Pool
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


def _line(job_id: str, task_id: str, line_no: int, text: str) -> LogRecord:
    return LogRecord(
        job_id=job_id,
        task_id=task_id,
        run_number=1,
        attempt=1,
        line_no=line_no,
        severity=Severity.INFO,
        stream="stdout",
        line=text,
    )


async def test_a_refused_line_is_stored_as_a_marker_and_its_batch_is_kept(pool: Pool) -> None:
    async with pool.acquire() as conn:
        # given a batch of eight lines, one of which PostgreSQL cannot hold (a NUL)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("logs", "shell", "true", ["a"]))
        task_id = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", job.id)
        texts = [f"line {n}" for n in range(8)]
        texts[5] = "bad\x00line"
        batch = [_line(job.id, task_id, n, text) for n, text in enumerate(texts)]

        # when it is stored
        stored = await logs_repo.insert_splitting(conn, batch)

        # then every other line is there as written, and the bad one is a marker saying why
        rows = await conn.fetch(
            "SELECT line_no, line FROM logs WHERE task_id = $1 ORDER BY line_no", task_id
        )
    assert [r["line_no"] for r in rows] == list(range(8))
    assert [r["line"] for r in rows if r["line_no"] != 5] == texts[:5] + texts[6:]
    assert "refused by the database" in rows[5]["line"]
    assert [r.line for r in stored] == [r["line"] for r in rows]
