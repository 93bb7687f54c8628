"""What counting a user's stored bytes costs the completing move of a task with outputs: the
records saved (`outputs_repo.save`) with and without the charge on the owner's row
(`quota_repo.charge_job`), for `--tasks` tasks of one user, `--concurrency` at once, against a
database of its own, in alternating rounds.

    python -m bench.store_quota --tasks 2000 --concurrency 8 --rounds 3

The charge updates one row per user, last in the move: a user's completing moves with outputs
wait for each other's commits there (what keeps two of them from both taking the last room),
so the figure at `--concurrency 1` is the statement's own cost and the one above it adds that
wait. Moves of different users never wait for each other.
"""

import argparse
import asyncio
import os
import time
import uuid

from bench.cluster import create_database, drop_database
from shared.domain.outputs import OutputRecord
from shared.store import db, jobs_repo, outputs_repo, quota_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob

_ADMIN = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def _round(pool: db.Pool, tasks: int, concurrency: int, charge: bool) -> float:
    """Seconds for `tasks` completing moves' output records of one new user's job."""
    async with pool.acquire() as conn:
        name = f"u-{uuid.uuid4().hex[:8]}"
        user = await users_repo.ensure_user(conn, name, "user", uuid.uuid4().hex)
        job, _ = await jobs_repo.create(
            conn, user.id, NewJob("b", "shell", "true", [str(i) for i in range(tasks)])
        )
        waiting = [t.id for t in await tasks_repo.list_for_job(conn, job.id)]

    async def complete() -> None:
        while waiting:
            task_id = waiting.pop()
            key = f"outputs/{job.id}/{task_id}/1/out"
            records = [OutputRecord("out", "out", 1000, "a" * 64, object_key=key)]
            async with pool.acquire() as conn, conn.transaction():
                added = await outputs_repo.save(conn, task_id, 1, "h-1", records)
                if charge:
                    await quota_repo.charge_job(conn, job.id, added, 0, "outputs")

    started = time.perf_counter()
    await asyncio.gather(*(complete() for _ in range(concurrency)))
    return time.perf_counter() - started


async def main(tasks: int, concurrency: int, rounds: int) -> None:
    name = f"bench_quota_{uuid.uuid4().hex[:8]}"
    url = await create_database(_ADMIN, name)
    try:
        async with db.open_pool(url, max_size=max(2, concurrency)) as pool:
            for _ in range(rounds):
                for charge in (False, True):
                    took = await _round(pool, tasks, concurrency, charge)
                    print(
                        f"{'with' if charge else 'without'} the charge: {tasks} moves,"
                        f" {concurrency} at once: {took:.2f} s, {tasks / took:.0f}/s"
                    )
    finally:
        await drop_database(_ADMIN, name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.concurrency, args.rounds))
