"""Big-job benchmark: one job of N inputs made, paged, recovered and cancelled (`shared/` alone).

    python -m bench.big_job [--inputs 100000]

Works on a database of its own (created, migrated and dropped on the local PostgreSQL, or the
server of `VIGIL_ADMIN_DATABASE_URL`); no service runs. Prints how long making the job's tasks
(with their `task.new` events), reading a page of 100 at its end, recovering every task once
they all failed (`recover_failed`), and cancelling it (every task terminated with its event)
take; each action is one transaction.
"""

import argparse
import asyncio
import os
import time
import uuid

from bench.cluster import create_database, drop_database
from shared import db, jobs_repo, task_actions, tasks_repo, users_repo
from shared.actions import JobAction
from shared.jobs_repo import NewJob

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
