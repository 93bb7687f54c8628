"""A Vigil installation of its own for benchmarks: apis, schedulers, and N hosts (a worker and a
supervisor each) as real processes on this machine, in a namespace and database of their own.

Used by `bench.chaos` (and its end-to-end test), which kills and restarts these processes, and
by `bench.local_cluster` (`scripts/cluster`), which runs it on clustered servers. Each process
runs in a session of its own and leaves its pid in `<root>/<name>.pid`.
"""

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import asyncpg
import httpx

from shared.host import work_root as work_roots
from shared.objects import STORE_CREDENTIALS
from shared.store.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]
_PER_HOST = ("supervisor", "worker")


#: The ports `free_port` gave in this process: the kernel may hand a port it gave and that
#: was released again, and two services of a cluster then bound the same one (an api's port
#: given again to its worker's health server: the api could not start).
_GIVEN: set[int] = set()


#: What a host's worker and supervisor are never given of the cluster's environment: the
#: object store's credentials (docs/explanation/storage.md, "Who holds what").
HOSTS_NEVER_GET = (*STORE_CREDENTIALS, "VIGIL_S3_ENDPOINT_URL")


def free_port() -> int:
    """A port free now, never one this process was given before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


async def create_database(admin_url: str, name: str) -> str:
    """Create and migrate database `name` on the server of `admin_url`; returns its URL."""
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    await migrate(url)
    return url


async def drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@dataclass
class Cluster:
    """The processes of one installation; `name` is `api`, `scheduler`, `worker@<host>`...;
    with several apis or schedulers, the second is `api-2`, `scheduler-2` and so on."""

    database_url: str
    amqp_url: str
    redis_url: str
    namespace: str
    root: Path
    hosts: list[str]
    #: `VIGIL_WORKER_SLOTS` of every worker; None: unset, the worker detects its host's CPUs.
    slots: int | None = 4
    apis: int = 1
    schedulers: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Settings of one host's worker and supervisor only (e.g. its own server URLs).
    host_env: dict[str, dict[str, str]] = field(default_factory=dict)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    port: int = field(default_factory=free_port)
    #: The ports of the second api and on (the first is `port`).
    more_ports: list[int] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: The health port of each process but the apis (which answer on their own port), kept
    #: across its restarts.
    health_ports: dict[str, int] = field(default_factory=dict)
    _logs: dict[str, IO[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.more_ports += [free_port() for _ in range(self.apis - 1 - len(self.more_ports))]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_ports(self) -> list[int]:
        return [self.port, *self.more_ports]

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.api_ports]

    @functools.cached_property
    def work_root(self) -> Path:
        """`<root>/work`, or, where a confined job could not reach it (a root that others may
        not traverse, as pytest's tmp dir), a dir of this cluster's own under the system's
        temporary dir (`shared/host/work_root.py`; removed by `remove_work_root`)."""
        return work_roots.choose(
            self.root / "work",
            Path(tempfile.gettempdir()) / f"vigil-{self.namespace}-{self.port}" / "work",
        )

    @property
    def shared_root(self) -> Path:
        """Where the dirs of `shared_dir` are: beside the work root, each job's scratch path
        (`VIGIL_JOB_SCRATCH_PATHS`), as a confined job's room shows nothing else of the host
        writable."""
        return self.work_root.parent / "shared"

    def shared_dir(self, name: str) -> Path:
        """A dir that the caller and this cluster's jobs share (markers, locks, effects), made
        if missing: under `shared_root`, and writable by all (sticky, as /tmp), as the jobs
        run as their owners' uids."""
        shared = self.shared_root / f"shared-{name}"
        shared.mkdir(parents=True, exist_ok=True)
        shared.chmod(0o1777)
        return shared

    def remove_work_root(self) -> None:
        """Remove the work root's dir if it is not under `root` (which its owner removes)."""
        if not self.work_root.is_relative_to(self.root):
            shutil.rmtree(self.work_root.parent, ignore_errors=True)

    def _env(self, host: str | None, port: int) -> dict[str, str]:
        slots = {} if self.slots is None else {"VIGIL_WORKER_SLOTS": str(self.slots)}
        env = {
            **{k: v for k, v in os.environ.items() if k != "VIGIL_WORKER_SLOTS"},
            "VIGIL_DATABASE_URL": self.database_url,
            "VIGIL_AMQP_URL": self.amqp_url,
            "VIGIL_REDIS_URL": self.redis_url,
            "VIGIL_NAMESPACE": self.namespace,
            "VIGIL_API_PORT": str(port),
            "VIGIL_BOOTSTRAP_TOKEN": self.token,
            "VIGIL_WORK_ROOT": str(self.work_root),
            # the stack's own claims of job uid ranges: many stacks on one host, each a fresh
            # installation, neither refuse each other nor leave claims on the host
            "VIGIL_UID_RANGES_DIR": str(self.work_root.parent / "uid-ranges"),
            **slots,
            "VIGIL_JOB_SCRATCH_PATHS": str(self.shared_root),
            # the outputs: in a directory store of the cluster's own
            "VIGIL_STORE_URL": (self.work_root.parent / "store").as_uri(),
            **self.extra_env,
        }
        if host is not None:
            env["VIGIL_HOST_ID"] = host
            env.update(self.host_env.get(host, {}))
            # a host holds no credential of the store (its links are signed by the scheduler)
            env = {k: v for k, v in env.items() if not k.startswith(HOSTS_NEVER_GET)}
        return env

    def start(self, name: str) -> None:
        """Start (or restart) one process, appending to `<root>/<name>.log`.

        With a single host, its worker and supervisor are simply `worker` and `supervisor`.
        """
        process, _, host = name.partition("@")
        service, _, nth = process.partition("-")
        port = self.api_ports[int(nth or 1) - 1] if service == "api" else 0
        if not host and service in _PER_HOST:
            [host] = self.hosts
        if name in self._logs:
            self._logs[name].close()
        log = (self.root / f"{name}.log").open("ab")
        self._logs[name] = log
        env = self._env(host or None, port)
        if service != "api":
            health_port = self.health_ports.setdefault(name, free_port())
            env[f"VIGIL_{service.upper()}_HEALTH_PORT"] = str(health_port)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # ^C in the terminal that started it does not reach it
        )
        (self.root / f"{name}.pid").write_text(str(self.procs[name].pid))

    def names(self) -> list[str]:
        apis = ["api", *(f"api-{n}" for n in range(2, self.apis + 1))]
        schedulers = ["scheduler", *(f"scheduler-{n}" for n in range(2, self.schedulers + 1))]
        if len(self.hosts) == 1:
            return [*apis, *schedulers, *_PER_HOST]
        per_host = [f"{s}@{h}" for h in self.hosts for s in _PER_HOST]
        return [*apis, *schedulers, *per_host]

    def start_all(self, timeout_s: float = 60.0) -> None:
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.shared_root.mkdir(exist_ok=True)
        for name in self.names():
            self.start(name)
        self.wait_healthy(timeout_s)

    def health_url(self, name: str) -> str:
        """Where process `name` answers its health probe."""
        service, _, nth = name.partition("@")[0].partition("-")
        port = self.api_ports[int(nth or 1) - 1] if service == "api" else self.health_ports[name]
        return f"http://127.0.0.1:{port}/healthz"

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every process answers its health probe with 200 (ok or degraded); raises
        with the log of a process that died, or of the first one that did not answer so."""
        deadline = time.monotonic() + timeout_s
        waiting, last = list(self.procs), "no answer"
        while waiting and time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited early:\n{self.log(name)}")
            try:
                response = httpx.get(self.health_url(waiting[0]), timeout=1)
                if response.status_code == 200:
                    waiting.pop(0)
                    continue
                last = response.text
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.1)
        if waiting:
            name = waiting[0]
            raise RuntimeError(f"{name} not healthy in {timeout_s}s ({last}):\n{self.log(name)}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""
