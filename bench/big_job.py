"""Big-job benchmark: one job of N inputs made, paged, recovered and cancelled (`shared/` alone).

    python -m bench.big_job [--inputs 100000]

Works on a database of its own (created, migrated and dropped on the local PostgreSQL, or the
server of `VIGIL_ADMIN_DATABASE_URL`); no service runs. Prints how long making the job's tasks
(with their `task.new` events), reading a page of 100 at its end, recovering every task once
they all failed (`recover_failed`), and cancelling it (every task terminated with its event)
take; each action is one transaction. It reads pages of the job's event history (two events a
task, numbered as the relay would) from the start, the middle and the newest end. Then it
gives every task three log lines and a kept
output and purges the job: the whole purge, and its longest statement and transaction (a purge
clears in batches: none may hold a lock long).
"""

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from bench.cluster import create_database, drop_database
from shared.domain.actions import JobAction
from shared.operations import harvest, task_actions
from shared.store import db, event_log, jobs_repo, outbox, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob

ADMIN_URL = os.environ.get("VIGIL_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def _bench(pool: db.Pool, inputs: int) -> None:
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, "bench", "user", uuid.uuid4().hex)
        new = NewJob("bench-big", "shell", "true", [str(i) for i in range(inputs)])
        start = time.perf_counter()
        job, _ = await jobs_repo.create(conn, user.id, new)
        made = time.perf_counter() - start
        print(f"made {inputs} tasks: {made:.2f} s")

        start = time.perf_counter()
        page = await tasks_repo.page_for_job(conn, job.id, after=inputs - 101, limit=100)
        paged = time.perf_counter() - start
        print(f"a page of {len(page)} at the end: {1000 * paged:.1f} ms")

        await conn.execute(
            "UPDATE tasks SET state = 'failed_on_cluster', failure_class = 'exit', exit_code = 1"
            " WHERE job_id = $1",
            job.id,
        )
        await conn.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", job.id)
        start = time.perf_counter()
        await task_actions.apply_to_job(conn, job.id, JobAction.RECOVER_FAILED, "bench")
        took = time.perf_counter() - start
        print(f"recovered every task: {took:.2f} s, {1e6 * took / inputs:.0f} µs per task")

        start = time.perf_counter()
        cancelled = await task_actions.apply_to_job(conn, job.id, JobAction.CANCEL, "bench")
        took = time.perf_counter() - start
        events = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE routing_key = $1", f"task.terminated.{job.id}"
        )
        print(
            f"cancelled ({cancelled.state.value}, {events} task.terminated events):"
            f" {took:.2f} s, {1e6 * took / inputs:.0f} µs per task"
        )
        await _history(conn, job.id)
        await _purge(conn, job.id, inputs)


class _Timed:
    """A connection whose statements and transactions are timed (the longest of each kept)."""

    def __init__(self, conn: db.Connection) -> None:
        self._conn = conn
        self.longest_statement = self.longest_transaction = 0.0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._conn, name)
        if name not in ("execute", "fetch", "fetchrow", "fetchval"):
            return call

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                self.longest_statement = max(self.longest_statement, time.perf_counter() - start)

        return timed

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        start = time.perf_counter()
        try:
            async with self._conn.transaction():
                yield
        finally:
            self.longest_transaction = max(self.longest_transaction, time.perf_counter() - start)


async def _history(conn: db.Connection, job_id: str) -> None:
    numbered = time.perf_counter()
    while await outbox.pending(conn, 5000):  # numbered and logged; never published here
        if not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE seq IS NULL AND exchange = 'events')"
        ):
            break
    count = await conn.fetchval("SELECT count(*) FROM events WHERE job_id = $1", job_id)
    print(f"numbered {count} events: {time.perf_counter() - numbered:.2f} s")
    await conn.execute("ANALYZE events")
    middle = await conn.fetchval(
        "SELECT seq FROM events WHERE job_id = $1 ORDER BY seq OFFSET $2 LIMIT 1",
        job_id,
        count // 2,
    )
    pages: list[tuple[str, Literal["oldest", "newest"], int | None]] = [
        ("oldest first", "oldest", None),
        ("from the middle", "oldest", middle),
        ("newest first", "newest", None),
    ]
    for label, order, start in pages:
        began = time.perf_counter()
        page = await event_log.of_job(conn, job_id, order=order, start=start, limit=1000)
        took = time.perf_counter() - began
        print(f"a page of {len(page)} of its history, {label}: {1000 * took:.1f} ms")


async def _purge(conn: db.Connection, job_id: str, inputs: int) -> None:
    await conn.execute(
        "UPDATE tasks SET host = 'h-bench', workdir = '/w/' || id WHERE job_id = $1", job_id
    )
    await conn.execute(
        "INSERT INTO logs (job_id, task_id, run_number, attempt, line_no, ts, severity, stream,"
        " line) SELECT t.job_id, t.id, 1, 1, n, now(), 'info', 'stdout', 'line ' || n"
        " FROM tasks t, generate_series(1, 3) AS n WHERE t.job_id = $1",
        job_id,
    )
    await conn.execute(
        "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256, content)"
        " SELECT id, 1, 'out.txt', '/w/' || id || '/out.txt', 'h-bench', 6, 'x', 'result'::bytea"
        " FROM tasks WHERE job_id = $1",
        job_id,
    )
    await conn.execute("ANALYZE logs; ANALYZE task_outputs")
    timed = _Timed(conn)
    start = time.perf_counter()
    purged = await harvest.purge_job(timed, job_id, "bench", "bench")  # type: ignore[arg-type]
    took = time.perf_counter() - start
    print(
        f"purged ({purged.logs} log lines, {purged.contents} outputs, {purged.removals}"
        f" removals): {took:.2f} s, {1e6 * took / inputs:.0f} µs per task; longest statement"
        f" {1000 * timed.longest_statement:.0f} ms, longest transaction"
        f" {1000 * timed.longest_transaction:.0f} ms"
    )


async def main(inputs: int) -> None:
    name = f"vigil_bench_big_{uuid.uuid4().hex[:8]}"
    url = await create_database(ADMIN_URL, name)
    try:
        async with db.open_pool(url) as pool:
            await _bench(pool, inputs)
    finally:
        await drop_database(ADMIN_URL, name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(main(args.inputs))
