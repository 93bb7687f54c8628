"""Clustered servers on one machine, each in a directory of its own: a RabbitMQ cluster of three
nodes (`RabbitCluster`) and a PostgreSQL primary with a synchronous streaming standby
(`PostgresPair`). For `bench.local_cluster`; the machine's own servers are not touched.

The node names, ports and data directories are their own (`vigil5710-mq1@localhost` on
`base_port + 1`...). Run as root, the servers' processes run as the `rabbitmq` and `postgres`
users (PostgreSQL refuses root), so `root` must be a directory they can reach (`/tmp/...`).
"""

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

#: The streaming standby's name, which the primary waits for at every commit.
STANDBY_NAME = "vigil_standby"
_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}"


def _as(user: str, command: Sequence[str]) -> list[str]:
    """`command` run as `user` when this process is root (and the user exists)."""
    if os.geteuid() != 0:
        return list(command)
    try:
        pwd.getpwnam(user)
    except KeyError:
        return list(command)
    return ["runuser", "-u", user, "--", *command]


def _give(path: Path, user: str) -> None:
    """Make `path` (a directory tree) belong to `user`, when this process is root."""
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return
    for where, _, files in os.walk(path):
        os.chown(where, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(Path(where) / name, entry.pw_uid, entry.pw_gid)


def _run(command: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


@dataclass(frozen=True)
class RabbitCluster:
    """Three RabbitMQ nodes clustered together; node n listens on `base_port + n`."""

    root: Path
    base_port: int
    nodes: int = 3

    def name(self, n: int) -> str:
        """Node n's Erlang name (with the base port: two clusters on one machine differ)."""
        return f"vigil{self.base_port}-mq{n}@localhost"

    def port(self, n: int) -> int:
        return self.base_port + n

    @property
    def url(self) -> str:
        """Every node, for `VIGIL_AMQP_URL`."""
        return ",".join(self.node_url(n) for n in range(1, self.nodes + 1))

    def node_url(self, n: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port(n)}/"

    def _dir(self, n: int) -> Path:
        return self.root / f"mq{n}"

    def ctl_env(self, n: int) -> dict[str, str]:
        where = self._dir(n)
        return {
            **os.environ,
            "RABBITMQ_CONF_ENV_FILE": str(where / "env.conf"),
            "RABBITMQ_NODENAME": self.name(n),
            "RABBITMQ_NODE_PORT": str(self.port(n)),
            "RABBITMQ_DIST_PORT": str(self.port(n) + 20000),
            "RABBITMQ_CONFIG_FILE": str(where / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(where / "plugins"),
            "RABBITMQ_MNESIA_BASE": str(where / "mnesia"),
            "RABBITMQ_LOG_BASE": str(where / "log"),
            "RABBITMQ_PID_FILE": str(where / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": _ERL_ARGS,
        }

    def _ctl(self, n: int, *args: str, timeout: float = 120) -> str:
        return _run(["rabbitmqctl", "-n", self.name(n), *args], self.ctl_env(n), timeout)

    def start(self) -> None:
        """Start the nodes, then join the second and third to the first."""
        for n in range(1, self.nodes + 1):
            self._prepare(n)
            self.start_node(n)
        for n in range(2, self.nodes + 1):
            self._ctl(n, "stop_app")
            self._ctl(n, "join_cluster", self.name(1))
            self._ctl(n, "start_app")

    def _prepare(self, n: int) -> None:
        where = self._dir(n)
        where.mkdir(parents=True, exist_ok=True)
        (where / "env.conf").write_text(f"NODENAME={self.name(n)}\nERL_EPMD_ADDRESS=127.0.0.1\n")
        (where / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port(n)}\n"
            "loopback_users.guest = true\n"
            "cluster_partition_handling = pause_minority\n"
        )
        (where / "plugins").write_text("[].\n")
        _give(where, "rabbitmq")

    def start_node(self, n: int) -> None:
        """Start node n (again) and wait until it runs."""
        _run(["rabbitmq-server", "-detached"], self.ctl_env(n))
        deadline = time.monotonic() + 60
        while not (self._dir(n) / "pid").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name(n)} did not start: see {self._dir(n)}/log")
            time.sleep(0.2)
        self._ctl(n, "wait", str(self._dir(n) / "pid"), "--timeout", "60")

    def stop_node(self, n: int) -> None:
        """Stop node n cleanly (the others go on)."""
        self._ctl(n, "shutdown", timeout=60)

    def stop(self) -> None:
        """Stop every node that still runs (by its pid: no CLI call waits on a stuck node)."""
        stop_processes([self.pid(n) for n in range(1, self.nodes + 1)])

    def pid(self, n: int) -> int:
        """Node n's pid (0: none)."""
        pid_file = self._dir(n) / "pid"
        return int(pid_file.read_text().strip() or 0) if pid_file.exists() else 0


@dataclass(frozen=True)
class PostgresPair:
    """A PostgreSQL primary on `base_port + 1` and its synchronous streaming standby on
    `base_port + 2`, each with its own data directory; the database is `database`."""

    root: Path
    base_port: int
    database: str = "vigil"

    def port(self, n: int) -> int:
        return self.base_port + n

    def _dir(self, n: int) -> Path:
        return self.root / f"pg{n}"

    @property
    def url(self) -> str:
        """Both servers, for `VIGIL_DATABASE_URL`: connections go to the writable one."""
        hosts = ",".join(f"127.0.0.1:{self.port(n)}" for n in (1, 2))
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write"

    def server_url(self, n: int, database: str | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port(n)}/{database or self.database}"

    def _bin(self, program: str) -> str:
        found = shutil.which(program)
        if found:
            return found
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
        if not versions:
            raise RuntimeError(f"{program} not found (PostgreSQL's server binaries)")
        return str(versions[-1] / program)

    def _pg(self, program: str, *args: str) -> str:
        return _run(_as("postgres", [self._bin(program), *args]))

    def start(self) -> None:
        """initdb the primary, start it, copy it into the standby (pg_basebackup), start that."""
        self.root.mkdir(parents=True, exist_ok=True)
        for n in (1, 2):
            self._dir(n).mkdir(mode=0o700, exist_ok=True)
            _give(self._dir(n), "postgres")
        self._pg("initdb", "-D", str(self._dir(1)), "-A", "trust", "-U", "postgres", "--no-sync")
        self._configure(
            1,
            f"synchronous_standby_names = '{STANDBY_NAME}'\n"  # no commit lost on failover
            "max_connections = 300\n"
            "wal_level = replica\n",
        )
        self.start_server(1)
        self._pg(
            "pg_basebackup",
            "-d",
            f"host=127.0.0.1 port={self.port(1)} user=postgres application_name={STANDBY_NAME}",
            "-D",
            str(self._dir(2)),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        # Promoted, the standby leads alone: it must not wait for a standby of its own.
        self._configure(2, "synchronous_standby_names = ''\n")
        self.start_server(2)

    def _configure(self, n: int, extra: str) -> None:
        where = self._dir(n)
        with (where / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"port = {self.port(n)}\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{where}'\n"
                "shared_buffers = '64MB'\n" + extra
            )

    def start_server(self, n: int) -> None:
        where = self._dir(n)
        self._pg("pg_ctl", "-D", str(where), "-l", str(where / "server.log"), "-w", "start")

    def stop_server(self, n: int, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self._dir(n)), "-m", mode, "-w", "stop")

    def promote(self, n: int) -> None:
        self._pg("pg_ctl", "-D", str(self._dir(n)), "-w", "promote")

    async def create_database(self) -> None:
        conn = await asyncpg.connect(self.server_url(1, "postgres"))
        try:
            await conn.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            await conn.close()

    def stop(self) -> None:
        """Stop both servers, whatever state they are in."""
        stop_processes([self.pid(1), self.pid(2)], signal.SIGQUIT)

    def pid(self, n: int) -> int:
        """Server n's postmaster pid (0: none)."""
        pid_file = self._dir(n) / "postmaster.pid"
        return int(pid_file.read_text().split("\n", 1)[0] or 0) if pid_file.exists() else 0


def stop_processes(pids: Sequence[int], sig: int = signal.SIGTERM, wait_s: float = 20) -> None:
    """Send `sig` to every pid, then SIGKILL those still there after `wait_s`."""
    pids = [pid for pid in pids if pid > 0]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if alive(pid)]
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process `pid` is there (not a zombie of ours: these are not our children)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
