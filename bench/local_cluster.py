"""A whole Vigil cluster on this machine, from one command: `scripts/cluster up --hosts 4`.

It starts, in a directory of its own (`--root`, /tmp/vigil-cluster by default):
- a RabbitMQ cluster of three nodes (`vigil<base>-mq1..3@localhost`, ports base+1..3);
- a PostgreSQL primary (base+11) and its synchronous streaming standby (base+12);
- two apis (base+3001, base+3002), two schedulers (one leads, the other waits for the lock);
- N hosts, each a worker and a supervisor with its own host id (`host-1`...) and work root,
  all serving the default pool;
the services reaching the servers through multi-node URLs (every RabbitMQ node; both
PostgreSQL servers with `target_session_attrs=read-write`). Redis is the machine's own
(`VIGIL_REDIS_URL`), under the namespace `cluster`.

`scripts/cluster env` prints what the CLI needs (`eval "$(scripts/cluster env)"`), `status`
what runs, and `down` stops and removes all of it.
`bench.failover` uses it to measure failovers (docs/explanation/scale-out.md).
"""

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import redis

from bench.cluster import Cluster
from bench.servers import PostgresPair, RabbitCluster, alive, stop_processes
from shared.store.migrate import migrate

DEFAULT_ROOT: Final = Path("/tmp/vigil-cluster")
DEFAULT_BASE_PORT: Final = 5710
NAMESPACE: Final = "cluster"
STATE_FILE: Final = "cluster.json"


@dataclass
class LocalCluster:
    """The servers and services of a cluster on this machine (see the module's doc)."""

    root: Path = DEFAULT_ROOT
    hosts: int = 4
    slots: int = 4
    base_port: int = DEFAULT_BASE_PORT
    redis_url: str = os.environ.get("VIGIL_REDIS_URL", "redis://127.0.0.1:6379/0")
    extra_env: dict[str, str] | None = None
    namespace: str = NAMESPACE

    def __post_init__(self) -> None:
        self.mq = RabbitCluster(self.root / "rabbitmq", self.base_port)
        self.pg = PostgresPair(self.root / "postgresql", self.base_port + 10)
        self.services = Cluster(
            database_url=self.pg.url,
            amqp_url=self.mq.url,
            redis_url=self.redis_url,
            namespace=self.namespace,
            root=self.root / "services",
            hosts=[f"host-{n}" for n in range(1, self.hosts + 1)],
            slots=self.slots,
            apis=2,
            schedulers=2,
            port=self.base_port + 3001,
            more_ports=[self.base_port + 3002],
            extra_env=dict(self.extra_env or {}),
        )

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    def up(self) -> None:
        """Start everything; raises if a cluster already lives in `root`."""
        if self.state_file.exists():
            raise RuntimeError(f"a cluster is already up in {self.root}: scripts/cluster down")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # the servers' users go through it
        self._save()  # from now on, `down` knows what to stop
        step("RabbitMQ: three nodes, clustered")
        self.mq.start()
        step("PostgreSQL: a primary and its synchronous standby")
        self.pg.start()
        asyncio.run(self.pg.create_database())
        asyncio.run(migrate(self.pg.url))
        step(f"Vigil: 2 apis, 2 schedulers, {self.hosts} hosts of {self.slots} slots")
        self.services.root.mkdir(parents=True, exist_ok=True)
        self.services.start_all(timeout_s=90)

    def _save(self) -> None:
        state = {
            "hosts": self.hosts,
            "slots": self.slots,
            "base_port": self.base_port,
            "token": self.services.token,
            "api_urls": self.services.api_urls,
            "amqp_url": self.mq.url,
            "database_url": self.pg.url,
            "namespace": self.namespace,
            "redis_url": self.redis_url,
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        self.state_file.chmod(0o600)

    @classmethod
    def load(cls, root: Path) -> "LocalCluster":
        """The cluster described by `root`'s state file (raises if there is none)."""
        state = json.loads((root / STATE_FILE).read_text())
        cluster = cls(
            root,
            state["hosts"],
            state["slots"],
            state["base_port"],
            redis_url=state["redis_url"],
            namespace=state["namespace"],
        )
        cluster.services.token = state["token"]
        return cluster

    @property
    def client_env(self) -> dict[str, str]:
        """What the CLI and the Python client need to use this cluster."""
        return {"VIGIL_URL": ",".join(self.services.api_urls), "VIGIL_TOKEN": self.services.token}

    def down(self) -> None:
        """Stop every process of the cluster and remove its directory (and Redis keys)."""
        self.services.stop_all()
        stop_processes([_pid(f) for f in self.services.root.glob("*.pid")])
        self.pg.stop()
        self.mq.stop()
        client = redis.Redis.from_url(self.redis_url)
        try:
            for key in client.scan_iter(match=f"{self.namespace}:*", count=1000):
                client.delete(key)
        finally:
            client.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def status(self) -> dict[str, bool]:
        """Each process of the cluster, and whether it runs."""
        running = {f.stem: alive(_pid(f)) for f in sorted(self.services.root.glob("*.pid"))}
        for n in range(1, self.mq.nodes + 1):
            running[self.mq.name(n)] = alive(self.mq.pid(n))
        for n in (1, 2):
            running[f"postgresql:{self.pg.port(n)}"] = alive(self.pg.pid(n))
        return running


def _pid(pid_file: Path) -> int:
    return int(pid_file.read_text().strip() or 0)


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--hosts", type=int, default=4, help="worker hosts (default 4)")
    parser.add_argument("--slots", type=int, default=4, help="slots of each host (default 4)")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT)
    args = parser.parse_args()
    if args.command == "up":
        cluster = LocalCluster(args.root, args.hosts, args.slots, args.base_port)
        started = time.monotonic()
        try:
            cluster.up()
        except BaseException:
            print("error: the cluster did not come up; stopping what started", file=sys.stderr)
            cluster.down()
            raise
        step(f'up in {time.monotonic() - started:.0f} s; to use it: eval "$(scripts/cluster env)"')
        return
    if not (args.root / STATE_FILE).exists():
        print(f"no cluster in {args.root}")
        return
    cluster = LocalCluster.load(args.root)
    if args.command == "down":
        cluster.down()
        step(f"stopped and removed {args.root}")
    elif args.command == "env":
        for key, value in cluster.client_env.items():
            print(f"export {key}={value}")
    else:
        for name, alive in cluster.status().items():
            print(f"{'running' if alive else 'stopped':8} {name}")


if __name__ == "__main__":
    main()
