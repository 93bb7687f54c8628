"""The control plane at cluster scale: what hosts and tasks cost centrally.

Starts an installation of its own (`bench.cluster`: an api and a scheduler, in a database and
namespace of their own, no host), then for each host count runs `bench.simhosts` with that
many simulated hosts and measures, with `bench.cpu`'s accounting of the central processes
(the api, the scheduler, PostgreSQL, RabbitMQ, Redis; never the simulator, which stands for
the hosts):

- idle: central CPU per idle host per second, over `--idle-s`;
- one job of `--tasks` inputs: wall time, completions/s, central CPU per task by process;
- `--jobs` one-task jobs submitted `--concurrency` at a time (W1's shape): the same;
- RabbitMQ's connections and memory, and the simulator's own CPU (what bounds it, here).

    python -m bench.control_plane --hosts 10,100,1000 --tasks 20000 --jobs 2000

The api, the scheduler and PostgreSQL's backends are this installation's own; RabbitMQ and
Redis are counted whole: run it alone on the machine.
"""

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import psutil

from bench import teardown
from bench.cluster import Cluster, create_database, drop_database
from shared.messaging.topology import Topology, delete_all

_CENTRAL = ("api", "scheduler", "postgres", "rabbitmq", "redis")


def _seconds(process: psutil.Process) -> float:
    try:
        t = process.cpu_times()
    except (psutil.Error, OSError):
        return 0.0
    return float(t.user + t.system)


def snapshot(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of this installation's central processes: its own api and
    scheduler, PostgreSQL's backends serving its database and the server's own background
    processes, and the whole of RabbitMQ and Redis (shared with whatever else runs)."""
    seconds = dict.fromkeys(_CENTRAL, 0.0)
    for name, proc in cluster.procs.items():
        kind = name.partition("-")[0]
        with contextlib.suppress(psutil.Error):
            seconds[kind] += _seconds(psutil.Process(proc.pid))
    database = cluster.database_url.rsplit("/", 1)[1]
    for process in psutil.process_iter(["name", "cmdline"]):
        name, args = process.info["name"] or "", " ".join(process.info["cmdline"] or ())
        if name.startswith("postgres") and (f" {database} " in args or "(" not in args):
            seconds["postgres"] += _seconds(process)
        elif name.startswith("beam"):
            seconds["rabbitmq"] += _seconds(process)
        elif name.startswith("redis"):
            seconds["redis"] += _seconds(process)
    return seconds


def _central(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {kind: after[kind] - before[kind] for kind in _CENTRAL}


def _cpu_of(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def _rabbit() -> tuple[int, int, int, float]:
    """RabbitMQ's connections, channels, consumers (of every queue) and resident memory (MiB)."""

    def rows(*what: str) -> list[list[str]]:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "--no-table-headers", *what],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return [line.split() for line in out.splitlines() if line.strip()]

    connections = len(rows("list_connections", "name"))
    channels = len(rows("list_channels", "pid"))
    consumers = sum(int(row[-1]) for row in rows("list_queues", "name", "consumers"))
    rss = sum(
        p.memory_info().rss for p in psutil.process_iter(["name"]) if p.info["name"] == "beam.smp"
    )
    return connections, channels, consumers, rss / 2**20


class Sim:
    """The simulator, as a process of its own."""

    def __init__(self, cluster: Cluster, args: argparse.Namespace, hosts: int) -> None:
        env = cluster._env(None, 0) | {"VIGIL_LOG_LEVEL": "WARNING"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.simhosts",
                "--hosts",
                str(hosts),
                "--cpus",
                str(args.cpus),
                "--duration",
                args.duration,
                "--work-root",
                str(cluster.root / "sim"),
                "--beat-connections",
                str(args.beat_connections),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=(cluster.root / "sim.log").open("ab"),
            text=True,
            # out of the terminal's process group: a Ctrl-C reaches this process only, whose
            # clean-up stops the simulator with one signal (a second one cancels its stop)
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"the simulator did not start: {line!r}")
        print(f"  {line.strip()}", flush=True)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        if out.strip():
            print(f"  {out.strip()}", flush=True)


async def _wait_done(database_url: str, name: str, timeout_s: float) -> None:
    """Until no job named `name` is active: read from the database, by the `jobs_active`
    index, every 0.2 s. Not through the api: its job list counts each job's tasks (a job of
    6,000 tasks, 5.7 ms of PostgreSQL a look, 0.14 ms a task over the job's run), which is
    the watcher's cost, not the tasks'."""
    conn = await asyncpg.connect(database_url, server_settings={"jit": "off"})
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'active' AND name = $1)", name
            ):
                return
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    raise SystemExit(f"jobs still active after {timeout_s}s")


async def _one_job(client: httpx.AsyncClient, database_url: str, name: str, tasks: int) -> None:
    body = {"name": name, "command": "true", "inputs": [str(i) for i in range(tasks)]}
    response = await client.post("/jobs", json=body, timeout=300)
    response.raise_for_status()
    await _wait_done(database_url, name, 3600)
    job = (await client.get(f"/jobs/{response.json()['id']}")).json()
    print(f"  the job {job['state']}: {job['counts']}, {job['superseded']} superseded", flush=True)


async def _many_jobs(
    client: httpx.AsyncClient, database_url: str, name: str, jobs: int, concurrency: int
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            response = await client.post("/jobs", json={"name": name, "command": "true"})
            response.raise_for_status()

    await asyncio.gather(*(one() for _ in range(jobs)))
    await _wait_done(database_url, name, 3600)


def _measure(
    label: str,
    cluster: Cluster,
    sim: Sim,
    count: int,
    unit: str,
    run: Callable[[], Coroutine[Any, Any, None]],
) -> dict[str, Any]:
    before, sim_before, began = snapshot(cluster), _cpu_of(sim.proc.pid), time.monotonic()
    asyncio.run(run())
    wall = time.monotonic() - began
    used = _central(before, snapshot(cluster))
    sim_used = _cpu_of(sim.proc.pid) - sim_before
    total = sum(used.values())
    per = ", ".join(f"{k} {1000 * v / count:.2f}" for k, v in used.items())
    print(
        f"  {label}: {count} {unit} in {wall:.1f} s = {count / wall:.0f}/s;"
        f" central {1000 * total / count:.2f} ms per {unit[:-1]} ({per});"
        f" simulator {1000 * sim_used / count:.2f} ms",
        flush=True,
    )
    return {"wall": wall, "rate": count / wall, "central_ms": 1000 * total / count}


def _idle(cluster: Cluster, sim: Sim, hosts: int, seconds: float) -> None:
    time.sleep(min(10.0, seconds))  # the hosts' first rounds settle
    before, sim_before = snapshot(cluster), _cpu_of(sim.proc.pid)
    time.sleep(seconds)
    used = _central(before, snapshot(cluster))
    sim_used = _cpu_of(sim.proc.pid) - sim_before
    total = sum(used.values())
    per = ", ".join(f"{k} {100 * v / seconds:.1f}" for k, v in used.items())
    connections, channels, consumers, rss = _rabbit()
    print(
        f"  idle: central {100 * total / seconds:.1f} % of a core"
        f" ({1e3 * total / seconds / hosts:.3f} ms per host per s; % of a core: {per});"
        f" simulator {100 * sim_used / seconds:.0f} %;"
        f" RabbitMQ {connections} connections, {channels} channels, {consumers} consumers,"
        f" {rss:.0f} MiB",
        flush=True,
    )


async def _log_statements(url: str, database: str) -> None:
    """Every statement run on `database` in the server's log (`--log-statements`), with its
    duration: what a task costs PostgreSQL, statement by statement."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'ALTER DATABASE "{database}" SET log_min_duration_statement = 0')
    finally:
        await conn.close()


async def _remove_queues(cluster: Cluster, hosts: int) -> None:
    """The namespace's queues and exchanges (two quorum queues a host: a broker keeps them,
    and recovers each one at its start, until they are deleted). The simulator deletes its
    hosts' at its end; here again, for a simulator that did not reach its own."""
    connection = await aio_pika.connect(cluster.amqp_url)
    async with connection:
        host_ids = [f"sim-{n + 1}" for n in range(hosts)]
        await delete_all(await connection.channel(), Topology(cluster.namespace), host_ids)


def _run(args: argparse.Namespace, hosts: int) -> None:
    admin = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    name = f"cp{uuid.uuid4().hex[:8]}"
    root = Path(tempfile.mkdtemp(prefix="vigil-cp-"))
    cluster = Cluster(
        database_url="",  # its own database, made below
        amqp_url=os.environ.get("VIGIL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        redis_url=os.environ.get("VIGIL_REDIS_URL", "redis://127.0.0.1:6379/0"),
        namespace=name,
        root=root,
        hosts=[],
        extra_env=dict(e.split("=", 1) for e in args.env),
    )
    print(f"{hosts} simulated hosts x {args.cpus:g} CPUs, commands {args.duration}", flush=True)
    sim: Sim | None = None
    try:
        url = cluster.database_url = asyncio.run(create_database(admin, name))
        if args.log_statements:
            asyncio.run(_log_statements(url, name))
        cluster.start_all()
        sim = Sim(cluster, args, hosts)
        _measure_all(args, cluster, sim, hosts)
    finally:
        teardown.each(
            [
                ("the simulator", lambda: sim.stop() if sim is not None else None),
                ("the services", cluster.stop_all),
                ("the queues and exchanges", lambda: asyncio.run(_remove_queues(cluster, hosts))),
                ("the database", lambda: asyncio.run(drop_database(admin, name))),
                ("its dir", lambda: shutil.rmtree(root, ignore_errors=True)),
            ]
        )


def _measure_all(args: argparse.Namespace, cluster: Cluster, sim: Sim, hosts: int) -> None:
    if args.idle_s > 0:
        _idle(cluster, sim, hosts, args.idle_s)
    url, name = cluster.database_url, cluster.namespace
    headers = {"Authorization": f"Bearer {cluster.token}"}

    def client() -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=cluster.base_url, headers=headers, timeout=60)

    if args.tasks:

        async def one() -> None:
            async with client() as c:
                await _one_job(c, url, f"{name}-one", args.tasks)

        _measure("one job", cluster, sim, args.tasks, "tasks", one)
    if args.jobs:

        async def many() -> None:
            async with client() as c:
                await _many_jobs(c, url, f"{name}-w1", args.jobs, args.concurrency)

        _measure("one-task jobs", cluster, sim, args.jobs, "jobs", many)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="10,100,1000", help="host counts, comma-separated")
    parser.add_argument("--cpus", type=float, default=16)
    parser.add_argument("--duration", default="fixed:1")
    parser.add_argument("--idle-s", type=float, default=20)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for services")
    parser.add_argument(
        "--beat-connections",
        type=int,
        default=4,
        help="the simulated hosts' beats' own database connections (a real host has its own)",
    )
    parser.add_argument(
        "--log-statements", action="store_true", help="every statement in PostgreSQL's log"
    )
    args = parser.parse_args()
    for hosts in (int(h) for h in args.hosts.split(",")):
        _run(args, hosts)


if __name__ == "__main__":
    main()
