"""`python -m bench.simhosts`: run simulated hosts against the services the environment names
(`VIGIL_DATABASE_URL`, `VIGIL_AMQP_URL`, `VIGIL_REDIS_URL`, `VIGIL_NAMESPACE`...) until
SIGTERM or SIGINT, then stop them as workers stop. Prints `ready N` once every host took its
place, and what its supervisors killed at the end."""

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aio_pika
from redis.asyncio import BlockingConnectionPool, Redis

from bench.simhosts.commands import Durations
from bench.simhosts.host import SimHost
from bench.teardown import signal_ignored
from services.supervisor.settings import SupervisorSettings
from services.worker.settings import WorkerSettings
from shared.host import handovers
from shared.host.capacity import HostCapacity
from shared.messaging.amqp import open_broker
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology, declare_all_work_queues, delete_host_queues
from shared.runtime.lifecycle import stop_on_signals
from shared.store.db import check_schema, open_pool
from shared.task_types import load_task_types


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.simhosts", description=__doc__)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--cpus", type=float, default=16, help="each host's CPUs")
    parser.add_argument("--memory-mb", type=int, default=65536, help="each host's memory")
    parser.add_argument("--duration", default="exp:1", help="fixed:S, uniform:A,B or exp:MEAN")
    parser.add_argument("--prefix", default="sim", help="host ids: <prefix>-<n>")
    parser.add_argument("--hosts-per-connection", type=int, default=50)
    parser.add_argument("--db-connections", type=int, default=20)
    parser.add_argument("--beat-connections", type=int, default=4, help="the beats' own")
    parser.add_argument("--work-root", default="", help="default: a temporary directory")
    parser.add_argument("--graceful-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


async def _run(args: argparse.Namespace) -> None:
    base = WorkerSettings()
    supervising = SupervisorSettings()
    durations = Durations.parse(args.duration)
    capacity = HostCapacity.of(args.cpus, args.memory_mb)
    work_root = Path(args.work_root or tempfile.mkdtemp(prefix="vigil-sim-"))
    task_types = load_task_types()
    topology = Topology(base.namespace)
    async with stop_on_signals() as stop, AsyncExitStack() as stack:
        pool = await stack.enter_async_context(
            open_pool(base.database_url, max_size=args.db_connections, generic_plans=True)
        )
        await check_schema(pool)
        beats = await stack.enter_async_context(
            open_pool(base.database_url, max_size=args.beat_connections, generic_plans=True)
        )
        # one client for every host, on a bounded pool (a connection per command in flight
        # would pass Redis' `maxclients`)
        redis = Redis(
            connection_pool=BlockingConnectionPool.from_url(
                base.redis_url, max_connections=256, timeout=30, decode_responses=True
            )
        )
        stack.push_async_callback(redis.aclose)
        brokers = []
        for n in range(0, args.hosts, args.hosts_per_connection):
            brokers.append(
                await stack.enter_async_context(
                    open_broker(base.amqp_url, topology, f"{args.prefix}-hosts-{n}")
                )
            )
        hosts = []
        for n in range(args.hosts):
            host_id = f"{args.prefix}-{n + 1}"
            root = work_root / host_id
            root.mkdir(parents=True, exist_ok=True)
            hosts.append(
                SimHost(
                    base.model_copy(update={"host_id": host_id, "work_root": str(root)}),
                    supervising.model_copy(update={"host_id": host_id}),
                    capacity,
                    pool,
                    beats,
                    brokers[n // args.hosts_per_connection],
                    redis,
                    task_types,
                    durations,
                    args.seed * 1_000_003 + n,
                )
            )
        began = time.monotonic()
        # Every queue declared before any is consumed: a quorum queue consumed while its
        # leader is still starting (many declared at once) closes the whole connection
        # (RabbitMQ's `{badmatch,{error,noproc}}` in `rabbit_quorum_queue:consume`).
        channel = await brokers[0].connection.channel()
        for host in hosts:
            await declare_all_work_queues(channel, topology, host.worker.host_id, base.worker_pool)
        await channel.close()
        starting = asyncio.Semaphore(16)

        async def start(host: SimHost) -> None:
            async with starting:
                await host.start()

        await asyncio.gather(*(start(host) for host in hosts))
        keys = RedisKeys(base.namespace)
        # a real supervisor waits on its own list; here one wait serves a group of hosts,
        # and a simulated supervisor does nothing with a hand-over (its worker sees the exit)
        takers = [
            asyncio.create_task(
                handovers.follow(
                    redis,
                    [
                        keys.handovers(h.worker.host_id)
                        for h in hosts[n : n + args.hosts_per_connection]
                    ],
                    lambda _watch: None,
                    stop,
                )
            )
            for n in range(0, len(hosts), args.hosts_per_connection)
        ]
        # The collector was 31 % of a core for 1,000 idle hosts (`gc.callbacks`' own count):
        # what the start made (the hosts' objects, pools, connections) lives as long as the
        # process, so it leaves the collector's generations, as in the scheduler (14 %
        # left), and the youngest generation is collected every 50,000 allocations, not 700
        # (none left while idle). CPU the hosts' beats and moves lacked in runs under load.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        print(
            f"ready {len(hosts)} hosts in {time.monotonic() - began:.1f} s"
            f" ({capacity.describe()} each; pid {os.getpid()})",
            flush=True,
        )
        await stop.wait()
        await asyncio.gather(*(host.stop(args.graceful_s) for host in hosts), *takers)
        killed = sum(host.sup.killed for host in hosts)
        fenced = sum(host.sup.fenced for host in hosts)
        print(f"stopped: {killed} command(s) killed on order, {fenced} by the fence", flush=True)


async def _remove_queues(args: argparse.Namespace) -> None:
    """Delete the queues of every host this run made: a stopped simulated host is retired (a
    host id of a later run declares them again at its start). On its own connection, as the
    hosts' may be gone; idempotent, so it runs whatever the run reached."""
    settings = WorkerSettings()
    topology = Topology(settings.namespace)
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        for n in range(args.hosts):
            await delete_host_queues(channel, topology, f"{args.prefix}-{n + 1}")


def main() -> None:
    logging.basicConfig(level=os.environ.get("VIGIL_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    args = _arguments()
    try:
        asyncio.run(_run(args))
    finally:
        with signal_ignored(signal.SIGINT):
            asyncio.run(_remove_queues(args))


if __name__ == "__main__":
    main()
