"""What a host's heartbeats cost PostgreSQL: the beats of `--hosts` idle hosts
(a worker's and a supervisor's each, every `--period` seconds, over `--connections`
connections, as `bench.simhosts` makes them: 4) against a database of their own, and
PostgreSQL's CPU for them.

    python -m bench.beat_cost --hosts 1000 --variant beats,plain,async

Variants: `beats` (the services' own statements, `hosts_repo.beat_worker` and
`beat_supervisor`), `plain` (a bare `UPDATE ... SET heartbeat_at = now()` each: what any
committed write costs), `async` (the services' statements with `synchronous_commit = off`),
`select1` (a `SELECT 1` each: a round trip with nothing to commit), `batched` (every host's
beats of a second in one transaction, as the leading scheduler writes beats sent through
Redis: `services/scheduler/beat_relay.py`).
Run it alone: PostgreSQL's background processes are counted whole.
"""

import argparse
import asyncio
import os
import uuid

import asyncpg
import psutil

from bench.cluster import create_database, drop_database
from shared.runtime.config import DEFAULT_POOL
from shared.store import hosts_repo

_ADMIN = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_seconds(database: str) -> float:
    """CPU seconds of the backends serving `database` and of the server's own processes."""
    total = 0.0
    for process in psutil.process_iter(["name", "cmdline"]):
        args = " ".join(process.info["cmdline"] or ())
        if (process.info["name"] or "").startswith("postgres") and (
            f" {database} " in args or "(" not in args
        ):
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


async def _beats(pool: asyncpg.Pool, host: str, variant: str) -> None:
    async with pool.acquire() as conn:
        if variant == "select1":
            await conn.fetchval("SELECT 1")
            await conn.fetchval("SELECT 1")
        elif variant == "plain":
            await conn.execute("UPDATE hosts SET heartbeat_at = now() WHERE id = $1", host)
            await conn.execute(
                "UPDATE hosts SET supervisor_heartbeat_at = now() WHERE id = $1", host
            )
        else:
            await hosts_repo.beat_worker(conn, host, "w-" + host)
            await hosts_repo.beat_supervisor(conn, host, "s-" + host, 10.0)


async def _run(variant: str, hosts: int, period: float, seconds: float, connections: int) -> None:
    name = f"beats{uuid.uuid4().hex[:8]}"
    url = await create_database(_ADMIN, name)
    settings = {"synchronous_commit": "off"} if variant == "async" else {}
    pool = await asyncpg.create_pool(
        url, min_size=connections, max_size=connections, server_settings=settings
    )
    ids = [f"h{n}" for n in range(hosts)]
    try:
        async with pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO hosts (id, slots, worker, supervisor, pool)"
                " VALUES ($1, 16, 'w-' || $1, 's-' || $1, $2)",
                [(host, DEFAULT_POOL) for host in ids],
            )

        async def host_loop(host: str, offset: float) -> None:
            await asyncio.sleep(offset)
            if variant == "batched":
                if host != ids[0]:
                    return
                while True:  # every host's two beats in one transaction a second
                    async with pool.acquire() as conn, conn.transaction():
                        await conn.execute(
                            "UPDATE hosts SET heartbeat_at = now() WHERE id = ANY($1)",
                            ids[: int(hosts / period)],
                        )
                        await conn.execute(
                            "UPDATE hosts SET supervisor_heartbeat_at = now() WHERE id = ANY($1)",
                            ids[: int(hosts / period)],
                        )
                    await asyncio.sleep(1.0)
            while True:
                await _beats(pool, host, variant)
                await asyncio.sleep(period)

        loops = [
            asyncio.create_task(host_loop(host, n * period / hosts)) for n, host in enumerate(ids)
        ]
        await asyncio.sleep(2 * period)
        before = _postgres_seconds(name)
        await asyncio.sleep(seconds)
        used = _postgres_seconds(name) - before
        beats = 2 * hosts / period
        print(
            f"{variant}: PostgreSQL {100 * used / seconds:.1f} % of a core for {beats:.0f}"
            f" beats/s ({1e3 * used / seconds / beats:.3f} ms a beat)",
            flush=True,
        )
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    finally:
        await pool.close()
        await drop_database(_ADMIN, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--period", type=float, default=2.5, help="seconds between beats")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--variant", default="beats,plain,async,select1,batched")
    args = parser.parse_args()
    for variant in args.variant.split(","):
        asyncio.run(_run(variant, args.hosts, args.period, args.seconds, args.connections))


if __name__ == "__main__":
    main()
