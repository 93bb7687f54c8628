"""Reading a job's cluster attempts back from PostgreSQL: where and when each command ran."""

from typing import Any

import asyncpg

from tests.e2e.stack import Stack


async def cluster_attempts(stack: Stack, job_id: str) -> list[Any]:
    """The job's cluster attempts (`host`, `started_at`, `ended_at`), first started first."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        return list(
            await conn.fetch(
                "SELECT a.host, a.started_at, a.ended_at FROM attempts a"
                " JOIN tasks t ON t.id = a.task_id"
                " WHERE t.job_id = $1 AND a.stage = 'cluster' ORDER BY a.started_at",
                job_id,
            )
        )
    finally:
        await conn.close()
