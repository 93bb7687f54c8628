"""Global fixes benchmark: one bulk `recover` over N failed tasks, and its dry run.

    python -m bench.bulk [--tasks 5000] [--jobs 50]

Works on a database of its own (created, migrated and dropped on the local PostgreSQL, or the
server of `VIGIL_ADMIN_DATABASE_URL`); no service runs. Prints how long selecting and counting
(dry run) and applying (one savepointed `apply_to_task` per task, committed in batches) take,
in all and per task, and the batch size's effect.
"""

import argparse
import asyncio
import os
import time
import uuid

from bench.cluster import create_database, drop_database
from shared.domain.actions import TaskAction
from shared.domain.selectors import TaskSelector
from shared.domain.states import FailureClass, TaskState
from shared.operations.bulk import BulkRequest, Limits, run
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob

ADMIN_URL = os.environ.get("VIGIL_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def _prepare(pool: db.Pool, tasks: int, jobs: int) -> users_repo.User:
    async with pool.acquire() as conn:
        operator = await users_repo.ensure_user(conn, "bench", "operator", uuid.uuid4().hex)
        per_job = tasks // jobs
        for j in range(jobs):
            new = NewJob(f"bench-{j}", "shell", "true", [str(i) for i in range(per_job)])
            await jobs_repo.create(conn, operator.id, new)
        await conn.execute(
            "UPDATE tasks SET state = 'failed_on_cluster', failure_class = 'lost', host = 'h1'"
        )
    return operator


async def _timed(
    pool: db.Pool, operator: users_repo.User, request: BulkRequest, batch: int
) -> float:
    limits = Limits(max_tasks=100_000, confirm_over=100_000, batch=batch)
    async with pool.acquire() as conn:
        start = time.perf_counter()
        outcome = await run(conn, request, operator, limits)
        elapsed = time.perf_counter() - start
    record = outcome.record
    what = "dry run" if request.dry_run else "applied"
    print(
        f"  {what} (batch {batch}): {record.matched} matched,"
        f" {record.applied} {'would change' if request.dry_run else 'changed'},"
        f" {elapsed:.2f} s, {1000 * elapsed / max(record.matched, 1):.2f} ms per task"
    )
    return elapsed


async def main(tasks: int, jobs: int) -> None:
    name = f"vigil_bench_bulk_{uuid.uuid4().hex[:8]}"
    url = await create_database(ADMIN_URL, name)
    try:
        async with db.open_pool(url) as pool:
            await _bench(pool, tasks, jobs)
    finally:
        await drop_database(ADMIN_URL, name)


async def _bench(pool: db.Pool, tasks: int, jobs: int) -> None:
    operator = await _prepare(pool, tasks, jobs)
    selector = TaskSelector(
        states=[TaskState.FAILED_ON_CLUSTER], failure_classes=[FailureClass.LOST]
    )
    print(f"{tasks} failed tasks in {jobs} jobs")
    await _timed(pool, operator, BulkRequest(selector, TaskAction.RECOVER, dry_run=True), 200)
    # the jobs bench-1, bench-10 ... bench-19 with small batches, then the rest
    some = selector.model_copy(update={"job_name": "bench-1*"})
    await _timed(pool, operator, BulkRequest(some, TaskAction.RECOVER), 20)
    await _timed(pool, operator, BulkRequest(selector, TaskAction.RECOVER), 200)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.jobs))
