"""The scheduler's planning round on the real PostgreSQL: the feed, the
planner and the claims, as the leading scheduler runs them.

    python -m bench.planning_round [--tasks 100000] [--jobs 1000] [--users 50] [--hosts 100]
                                   [--history 0] [--ended-jobs 0] [--running 0] [--repeat 9]

Makes a database of its own with `--hosts` live hosts of 16 CPUs, `--jobs` jobs of `--users`
users with `--tasks` new tasks among them, optionally `--history` ended tasks (a job's
history must not slow a round down), optionally `--ended-jobs` completed one-task jobs (a
pool's history of small jobs, W1's: nor must theirs), and `--running` active one-task jobs
whose task runs
(a pool running many small jobs at once: active jobs with nothing to place). Then times
`Dispatcher.run_once()` (the round's whole transaction: feed, plan, claims, reasons, the
resting tasks' release) in two states:

- busy: every host full, one task ending before each round (the steady state of a backlog:
  the round places one task and gives every job its reason);
- idle: the first round on empty hosts, placing a whole pool's worth at once.

Prints the median, min and max (ms), and the feed's share; asserts nothing.
"""

import argparse
import asyncio
import statistics
import time
import uuid

from services.scheduler import statistics as table_statistics
from services.scheduler.dispatcher import Dispatcher
from shared.domain.scheduling.model import Settings
from shared.store import db, plan_repo
from tests.conftest import create_database, drop_database

POOL = "default"
_HISTORY_CHUNK = 1_000_000


async def _populate(
    conn: db.Connection,
    tasks: int,
    jobs: int,
    users: int,
    hosts: int,
    history: int,
    running: int = 0,
    ended_jobs: int = 0,
) -> None:
    await conn.execute(
        "INSERT INTO users (id, name, role) SELECT 'u' || n, 'user' || n, 'user'"
        " FROM generate_series(1, $1) n",
        users,
    )
    await conn.execute(
        "INSERT INTO jobs (id, owner_id, name, type, command, state, priority, created_at)"
        " SELECT 'j' || n, 'u' || (1 + n % $2), 'bench', 'shell', 'true', 'active', n % 3,"
        "   now() - make_interval(secs => n)"
        " FROM generate_series(1, $1) n",
        jobs,
        users,
    )
    await conn.execute(
        "INSERT INTO tasks (id, job_id, index, input, state)"
        " SELECT 't' || n, 'j' || (1 + n % $2), n / $2, to_jsonb(n), 'new'"
        " FROM generate_series(1, $1) n",
        tasks,
        jobs,
    )
    for first in range(1, history + 1, _HISTORY_CHUNK):  # each within a statement's timeout
        await conn.execute(
            "INSERT INTO tasks (id, job_id, index, input, state, host)"
            " SELECT 'h' || n, 'j' || (1 + n % $2), -1 - n / $2, to_jsonb(n), 'completed',"
            "   'h' || (1 + n % $4)"  # where it ran
            " FROM generate_series($3::bigint, $1) n",
            min(history, first + _HISTORY_CHUNK - 1),
            jobs,
            first,
            hosts,
            timeout=600,
        )
    for first in range(1, ended_jobs + 1, _HISTORY_CHUNK):
        last = min(ended_jobs, first + _HISTORY_CHUNK - 1)
        await conn.execute(
            "INSERT INTO jobs (id, owner_id, name, type, command, state, created_at, finished_at)"
            " SELECT 'e' || n, 'u' || (1 + n % $3), 'ended', 'shell', 'true', 'completed',"
            "   now() - interval '1 day', now() - interval '1 day'"
            " FROM generate_series($1::bigint, $2) n",
            first,
            last,
            users,
            timeout=600,
        )
        await conn.execute(
            "INSERT INTO tasks (id, job_id, index, input, state, host)"
            " SELECT 'te' || n, 'e' || n, 0, to_jsonb(n), 'completed', 'h' || (1 + n % $3)"
            " FROM generate_series($1::bigint, $2) n",
            first,
            last,
            hosts,
            timeout=600,
        )
    await conn.execute(
        "INSERT INTO jobs (id, owner_id, name, type, command, state)"
        " SELECT 'r' || n, 'u' || (1 + n % $2), 'running', 'shell', 'true', 'active'"
        " FROM generate_series(1, $1) n",
        running,
        users,
    )
    await conn.execute(
        "INSERT INTO tasks (id, job_id, index, input, state, host, claim, hold_owner,"
        "   hold_millicpus, hold_memory_mb, hold_gpus)"  # as the round's claim leaves them
        " SELECT 'tr' || n, 'r' || n, 0, to_jsonb(n), 'on_cpu', 'h' || (1 + n % $2),"
        "   gen_random_uuid(), 'u' || (1 + n % $3), 1000, 0, 0 FROM generate_series(1, $1) n",
        running,
        hosts,
        users,
    )
    await conn.execute(
        "INSERT INTO hosts (id, slots, worker, pool, capacity_millicpus)"
        " SELECT 'h' || n, 16, 'w' || n, $2, 16000 FROM generate_series(1, $1) n",
        hosts,
        POOL,
    )
    await conn.execute("VACUUM ANALYZE", timeout=1800)  # as autovacuum leaves a table at rest


async def _timed(dispatcher: Dispatcher) -> tuple[float, int]:
    started = time.perf_counter()
    released = (await dispatcher.run_once()).released
    return (time.perf_counter() - started) * 1000, released


async def _feed_ms(pool: db.Pool) -> float:
    async with pool.acquire() as conn, conn.transaction():
        started = time.perf_counter()
        await plan_repo.read(conn, POOL, 60.0, 0, 500)
        return (time.perf_counter() - started) * 1000


async def _end_one(pool: db.Pool) -> None:
    await pool.execute(
        "UPDATE tasks SET state = 'completed', claim = NULL"
        " WHERE id = (SELECT id FROM tasks WHERE claim IS NOT NULL LIMIT 1)"
    )


async def main(args: argparse.Namespace) -> None:
    name = f"vigil_bench_round_{uuid.uuid4().hex[:8]}"
    url = await create_database(name)
    try:
        async with db.open_pool(url, max_size=2) as pool:
            async with pool.acquire() as conn:
                await _populate(
                    conn,
                    args.tasks,
                    args.jobs,
                    args.users,
                    args.hosts,
                    args.history,
                    args.running,
                    args.ended_jobs,
                )
            dispatcher = Dispatcher(pool, 500, POOL, policy=Settings(), fresh_s=3600.0)
            idle_ms, placed = await _timed(dispatcher)
            while (await dispatcher.run_once()).released:  # fill every host
                pass
            async with pool.acquire() as conn:  # the leader's next look at the statistics
                analysed = await table_statistics.analyse_due(conn, dispatcher.planning.held)
            busy: list[float] = []
            feed: list[float] = []
            for _ in range(args.repeat):
                await _end_one(pool)
                ms, _ = await _timed(dispatcher)
                busy.append(ms)
                feed.append(await _feed_ms(pool))
        print(
            f"pool: {args.tasks} waiting tasks, {args.jobs} jobs, {args.users} users,"
            f" {args.hosts} hosts of 16 CPUs, {args.history} ended tasks,"
            f" {args.ended_jobs} ended one-task jobs,"
            f" {args.running} one-task jobs running"
        )
        print(f"idle round (first, empty hosts): {idle_ms:.1f} ms, {placed} tasks placed")
        print(f"then analysed: {', '.join(analysed) or 'nothing'}")
        print(
            f"busy round: median {statistics.median(busy):.1f} ms"
            f" (min {min(busy):.1f}, max {max(busy):.1f}) over {args.repeat} rounds;"
            f" of which the feed alone {statistics.median(feed):.1f} ms"
        )
    finally:
        await drop_database(name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument("--ended-jobs", type=int, default=0)
    parser.add_argument("--running", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=9)
    asyncio.run(main(parser.parse_args()))
