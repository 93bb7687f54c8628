"""What one task costs PostgreSQL: transactions, row writes and WAL per task, end to end.

Runs against a system that is up (`scripts/up`), alone on the database (the counters are the
whole database's): `python -m bench.cost [--tasks 1000] [--jobs 300] [--command true]`. Two
workloads of `--command`: one job with `--tasks` inputs, and `--jobs` separate one-task jobs (0
skips either); for each it prints the wall
time, tasks/s, and per task the committed transactions (reads included: every statement outside
a transaction is one), rows inserted and updated, and WAL bytes, from `pg_stat_database` and
`pg_current_wal_lsn()` read before and after (the services' background work included).

Slot scaling: `VIGIL_WORKER_SLOTS=32 scripts/up --no-demo`, then
`python -m bench.cost --tasks 5000 --jobs 0 --command "sleep 0.1"` (ideal: 320 tasks/s).
"""

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

import asyncpg
import httpx

from bench.throughput import _token, _wait_done

_STATS = (
    "SELECT xact_commit, tup_inserted, tup_updated, pg_current_wal_lsn() AS lsn"
    " FROM pg_stat_database WHERE datname = current_database()"
)


async def _counters(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        await asyncio.sleep(1.5)  # backends report their counters at most every second
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow(_STATS)
        assert row is not None
        wal = await conn.fetchval("SELECT $1::pg_lsn - '0/0'::pg_lsn", row["lsn"])
        return {**dict(row), "wal": int(wal)}
    finally:
        await conn.close()


async def _run(
    client: httpx.AsyncClient, dsn: str, label: str, bodies: list[dict[str, Any]], tasks: int
) -> None:
    name = bodies[0]["name"]
    before = await _counters(dsn)
    started = time.monotonic()
    gate = asyncio.Semaphore(8)

    async def submit(body: dict[str, Any]) -> None:
        async with gate:
            (await client.post("/jobs", json=body)).raise_for_status()

    await asyncio.gather(*(submit(b) for b in bodies))
    await _wait_done(client, name, 900)
    wall = time.monotonic() - started
    after = await _counters(dsn)
    per = {
        k: (after[k] - before[k]) / tasks for k in ("xact_commit", "tup_inserted", "tup_updated")
    }
    print(
        f"{label}: {tasks} tasks in {wall:.1f}s = {tasks / wall:.0f} tasks/s | per task:"
        f" {per['xact_commit']:.1f} transactions, {per['tup_inserted']:.1f} rows inserted,"
        f" {per['tup_updated']:.1f} rows updated, {(after['wal'] - before['wal']) / tasks:.0f}"
        " WAL bytes"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1000, help="inputs of the one big job")
    parser.add_argument("--jobs", type=int, default=300, help="separate one-task jobs")
    parser.add_argument("--command", default="true", help="what every task runs")
    parser.add_argument("--url", default=os.environ.get("VIGIL_URL", "http://127.0.0.1:8000"))
    parser.add_argument(
        "--dsn",
        default=os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {_token()}"}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=60) as client:
        if args.tasks:
            one = f"cost-one-{uuid.uuid4().hex[:8]}"
            inputs = [str(i) for i in range(args.tasks)]
            body = {"name": one, "command": args.command, "inputs": inputs}
            await _run(client, args.dsn, "one job x N inputs", [body], args.tasks)
        if args.jobs:
            many = f"cost-many-{uuid.uuid4().hex[:8]}"
            bodies = [{"name": many, "command": args.command} for _ in range(args.jobs)]
            await _run(client, args.dsn, "N one-task jobs", bodies, args.jobs)


if __name__ == "__main__":
    asyncio.run(main())
