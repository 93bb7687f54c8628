"""What hosts' queues cost the broker, and what ended pilots leave behind.

    python -m bench.host_queues --hosts 10,25,50,100

Every host has two durable quorum queues. This bench runs a RabbitMQ node of its own (a
scratch dir and free ports, Vigil's `deploy/rabbitmq/advanced.config`; never the broker the
environment names, since it restarts the node) and an installation of its own on it
(`bench.cluster`: an api and a scheduler, a database and namespace of their own). For each
host count N, with `bench.simhosts`:

- the pool's start: seconds until N simulated hosts are ready (each registered, its two
  queues declared), and the broker's memory with them running;
- the queues alone: the simulator killed (as an allocation that ends kills a pilot's
  processes, its queues left), the broker's queues and memory (Erlang's total, quorum
  queues' processes and tables) beside the node's without them;
- the node's start with them: `stop_app`, then `start_app` until every queue runs again;
- their deletion (`topology.delete_host_queues`, as the scheduler deletes a retired host's).

Then `--ended-pilots` ended pilots (their `hosts` and `pilots` rows, their queues deleted):
the bytes their rows take, and what the leading scheduler's look for hosts to retire and
`GET /hosts`'s read cost with them. The node, the installation and the dirs are removed at
the end, even when interrupted.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
from redis.asyncio import Redis

from bench import teardown
from bench.cluster import ROOT, Cluster, create_database, drop_database, free_port
from services.api import hosts
from services.scheduler.host_queues import HostQueues
from shared.messaging.amqp import open_broker
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology, delete_host_queues
from shared.store.db import open_pool

MIB = 2**20


class Node:
    """A RabbitMQ node of the bench's own, in `root`, listening on a free port."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.name = f"vigilhq{uuid.uuid4().hex[:6]}@localhost"
        (root / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        shutil.copy(ROOT / "deploy" / "rabbitmq" / "advanced.config", root / "advanced.config")
        (root / "plugins").write_text("[].\n")
        (root / "env.conf").write_text(f"NODENAME={self.name}\n")
        for path in [root, *root.rglob("*")]:  # the server runs as its own user
            shutil.chown(path, "rabbitmq", "rabbitmq")
        self.env = os.environ | {
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_CONF_ENV_FILE": str(root / "env.conf"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "plugins"),
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_PID_FILE": str(root / "pid"),
            "RABBITMQ_DIST_PORT": str(free_port()),
        }

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def ctl(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            ["rabbitmqctl", "-q", "-n", self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout

    def start(self, within_s: float = 120) -> None:
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, check=True)
        deadline = time.monotonic() + within_s
        while True:  # the node answers only once its Erlang VM is up
            try:
                self.ctl("await_startup", "--timeout", "120")
                return
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def stop(self) -> None:
        self.ctl("stop")

    def memory(self) -> dict[str, float]:
        """Erlang's total, and the quorum queues' processes and tables, in MiB."""
        status = json.loads(self.ctl("status", "--formatter", "json"))["memory"]
        return {
            "total": status["total"]["erlang"] / MIB,
            "quorum": (status["quorum_queue_procs"] + status["quorum_ets"]) / MIB,
        }

    def queues(self, prefix: str) -> dict[str, str]:
        """The node's queues whose names start with `prefix`, with their state."""
        listed = self.ctl("list_queues", "--no-table-headers", "name", "state")
        rows = (line.split() for line in listed.splitlines() if line.strip())
        return {row[0]: row[-1] for row in rows if row[0].startswith(prefix)}

    def connections(self) -> int:
        return len(self.ctl("list_connections", "--no-table-headers", "name").splitlines())

    def restart_app(self, prefix: str, expected: int) -> tuple[float, float]:
        """Seconds to stop the app, and to start it until `expected` queues run again."""
        began = time.monotonic()
        self.ctl("stop_app")
        stopped = time.monotonic()
        self.ctl("start_app")
        while sum(s == "running" for s in self.queues(prefix).values()) < expected:
            time.sleep(0.2)
        return stopped - began, time.monotonic() - stopped


def _settle(node: Node, connections: int, within_s: float = 60) -> None:
    """Until the node has `connections` connections again (a killed client's closed, the
    services' reconnected after a restart), or `within_s` passed."""
    deadline = time.monotonic() + within_s
    while node.connections() != connections and time.monotonic() < deadline:
        time.sleep(0.5)


def _simulator(cluster: Cluster, hosts: int) -> tuple[subprocess.Popen[str], float]:
    """`bench.simhosts` with `hosts` idle hosts, and seconds until it said they are ready."""
    env = cluster._env(None, 0) | {"VIGIL_LOG_LEVEL": "WARNING"}
    args = ["--hosts", str(hosts), "--cpus", "2", "--work-root", str(cluster.root / "sim")]
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.simhosts", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=(cluster.root / "sim.log").open("ab"),
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise SystemExit(f"the simulator did not start: {line!r}")
    return proc, time.monotonic() - began


async def _delete(node: Node, namespace: str, hosts: int) -> float:
    """Seconds to delete the hosts' queues, one host after the other, as the scheduler does."""
    topology = Topology(namespace)
    connection = await aio_pika.connect(node.amqp_url)
    async with connection:
        channel = await connection.channel()
        began = time.monotonic()
        for n in range(hosts):
            await delete_host_queues(channel, topology, f"sim-{n + 1}")
        return time.monotonic() - began


def _pool(node: Node, cluster: Cluster, hosts: int, base: dict[str, float]) -> None:
    prefix = f"{cluster.namespace}."
    own = len(node.queues(prefix))
    connections = node.connections()
    sim, ready_s = _simulator(cluster, hosts)
    try:
        time.sleep(5)  # the hosts' first beats and rounds
        running = node.memory()
    finally:
        sim.kill()
        sim.wait()
    _settle(node, connections)
    left = node.memory()
    queues = len(node.queues(prefix)) - own
    stop_s, start_s = node.restart_app(prefix, own + queues)
    _settle(node, connections)  # the services reconnect
    deleted_s = asyncio.run(_delete(node, cluster.namespace, hosts))
    after = node.memory()
    per_host = (left["total"] - after["total"]) / hosts
    print(
        f"{hosts} hosts: ready in {ready_s:.1f} s; {queues} host queues;"
        f" broker {running['total']:.0f} MiB running ({base['total']:.0f} without them),"
        f" {left['total']:.0f} MiB with their queues alone"
        f" (quorum queues {left['quorum']:.1f} MiB), {after['total']:.0f} MiB once deleted:"
        f" {1024 * per_host:.0f} KiB a host's two queues; node restart with them:"
        f" stop_app {stop_s:.1f} s, start_app until all run {start_s:.1f} s;"
        f" deleted in {deleted_s:.2f} s ({1000 * deleted_s / hosts:.1f} ms a host)",
        flush=True,
    )


_ENDED = """
WITH h AS (
    INSERT INTO hosts (id, slots, heartbeat_at, queues_deleted_at)
    SELECT 'ended-' || n, 0, now() - interval '1 day', now() - interval '1 day'
    FROM generate_series(1, $1) n RETURNING id)
INSERT INTO pilots (id, pool, backend, state, host_id, cpus, walltime_s, requested_by, reason)
SELECT 'p-' || h.id, 'default', 'slurm', 'ended', h.id, 1, 3600, 'scheduler', 'idle' FROM h
"""

_SIZE = "SELECT pg_total_relation_size('hosts') + pg_total_relation_size('pilots')"


async def _ended_pilots(node: Node, cluster: Cluster, count: int) -> None:
    """`count` ended pilots' rows: their bytes, and the reads that walk the hosts."""
    async with open_pool(cluster.database_url, max_size=2) as pool:
        await pool.execute("ANALYZE hosts; ANALYZE pilots")
        before = await pool.fetchval(_SIZE)
        await pool.execute(_ENDED, count)
        await pool.execute("ANALYZE hosts; ANALYZE pilots")
        size = await pool.fetchval(_SIZE) - before
        topology = Topology(cluster.namespace)
        async with open_broker(node.amqp_url, topology, "bench-host-queues") as broker:
            retiring = HostQueues(pool, broker, dead_after_s=10)
            look_ms = await _best_ms(retiring.run_once)
        redis = Redis.from_url(cluster.redis_url)
        try:
            async with pool.acquire() as conn:
                keys = RedisKeys(cluster.namespace)
                list_ms = await _best_ms(lambda: hosts.list_hosts(conn, redis, keys))
        finally:
            await redis.aclose()
    print(
        f"{count} ended pilots: no queue; their rows {size / MIB:.1f} MiB"
        f" ({size / count:.0f} bytes a pilot); the scheduler's look for hosts to retire"
        f" {look_ms:.1f} ms (every few seconds), GET /hosts's read {list_ms:.1f} ms",
        flush=True,
    )


async def _best_ms(call: Any, times: int = 5) -> float:
    """The fastest of `times` awaited calls, in ms (the first warms the caches)."""
    best = float("inf")
    for _ in range(times):
        began = time.perf_counter()
        await call()
        best = min(best, time.perf_counter() - began)
    return 1000 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="10,25,50,100", help="host counts, comma-separated")
    parser.add_argument("--ended-pilots", type=int, default=10_000)
    args = parser.parse_args()
    counts = [int(h) for h in args.hosts.split(",") if h]
    admin = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    node_root = Path(tempfile.mkdtemp(prefix="vigil-hq-node-"))
    node_root.chmod(0o755)  # the server runs as its own user
    node = Node(node_root)
    name = f"hq{uuid.uuid4().hex[:8]}"
    cluster = Cluster(
        database_url="",
        amqp_url=node.amqp_url,
        redis_url=os.environ.get("VIGIL_REDIS_URL", "redis://127.0.0.1:6379/0"),
        namespace=name,
        root=Path(tempfile.mkdtemp(prefix="vigil-hq-")),
        hosts=[],
    )
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        node.start()
        cluster.database_url = asyncio.run(create_database(admin, name))
        cluster.start_all()
        base = node.memory()
        own, connections = len(node.queues(f"{name}.")), node.connections()
        stop_s, start_s = node.restart_app(f"{name}.", own)
        _settle(node, connections)
        print(
            f"no host: broker {base['total']:.0f} MiB, {own} queues of the installation;"
            f" node restart: stop_app {stop_s:.1f} s, start_app until all run {start_s:.1f} s",
            flush=True,
        )
        for hosts_count in counts:
            _pool(node, cluster, hosts_count, base)
        if args.ended_pilots:
            asyncio.run(_ended_pilots(node, cluster, args.ended_pilots))
    finally:
        teardown.each(
            [
                ("the services", cluster.stop_all),
                ("the node", node.stop),
                ("the database", lambda: asyncio.run(drop_database(admin, name))),
                ("the node's dir", lambda: shutil.rmtree(node_root, ignore_errors=True)),
                ("the services' dir", lambda: shutil.rmtree(cluster.root, ignore_errors=True)),
            ]
        )


if __name__ == "__main__":
    main()
