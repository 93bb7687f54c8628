"""Log pages have a byte budget: a page of 10,000 long lines was tens of MiB, and a few at
once took the api to 470 MiB. A page now stops once its text reaches a byte budget; the next
page starts where it stopped, so nothing is skipped."""

import uuid

import pytest

from shared.domain.messages import LogRecord, Severity
from shared.store import db, jobs_repo, logs_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


async def test_a_page_stops_at_its_byte_budget_and_the_next_goes_on_from_there(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("loud", "shell", "true", ["a"]))
        [task] = await tasks_repo.list_for_job(conn, job.id)
        lines = [
            LogRecord(
                job_id=job.id,
                task_id=task.id,
                run_number=1,
                attempt=1,
                line_no=n,
                severity=Severity.INFO,
                stream="stdout",
                line=f"{n:03d}" + "x" * 97,  # 100 bytes each
            )
            for n in range(1, 11)
        ]
        await logs_repo.insert(conn, lines)

        first = await logs_repo.for_job(conn, job.id, limit=100, max_bytes=350)
        rest = await logs_repo.for_job(conn, job.id, after=first[-1].seq, limit=100, max_bytes=350)
        huge = await logs_repo.for_job(conn, job.id, limit=100, max_bytes=10)

    assert [log.line[:3] for log in first] == ["001", "002", "003", "004"]
    assert [log.line[:3] for log in rest] == ["005", "006", "007", "008"]
    assert [log.line[:3] for log in huge] == ["001"]  # a page always carries its first line
