"""The four services as real processes, on a database and namespace of their own."""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

SERVICES = ("api", "scheduler", "worker", "supervisor")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    """Starts, stops and kills the services; their logs go to `log_dir`."""

    database_url: str
    amqp_url: str
    redis_url: str
    namespace: str
    root: Path
    token: str
    port: int = field(default_factory=free_port)
    host_id: str = "e2e-host"
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: dict[str, IO[bytes]] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def work_root(self) -> Path:
        return self.root / "work"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "VIGIL_DATABASE_URL": self.database_url,
            "VIGIL_AMQP_URL": self.amqp_url,
            "VIGIL_REDIS_URL": self.redis_url,
            "VIGIL_NAMESPACE": self.namespace,
            "VIGIL_API_PORT": str(self.port),
            "VIGIL_BOOTSTRAP_TOKEN": self.token,
            "VIGIL_HOST_ID": self.host_id,
            "VIGIL_WORK_ROOT": str(self.work_root),
            "VIGIL_WORKER_SLOTS": "4",
            "VIGIL_LOG_LEVEL": "DEBUG",
            "VIGIL_GRACEFUL_TIMEOUT_S": "5",
            # detection scaled down for tests: a silent worker or host is judged in 3 s
            "VIGIL_VITALS_S": "0.2",
            "VIGIL_KILL_GRACE_S": "1",
            "VIGIL_DEAD_WORKER_S": "3",
            "VIGIL_DEAD_HOST_S": "3",
            "VIGIL_FENCE_TIMEOUT_S": "60",
            "VIGIL_QUARANTINE_AFTER": "0",
            **self.extra_env,
        }

    def start(self, service: str) -> None:
        """Start `python -m services.<service>` (appending to its log)."""
        if service in self._logs:  # a restart: the earlier process's log handle is done
            self._logs[service].close()
        log = (self.root / f"{service}.log").open("ab")
        self._logs[service] = log
        self.procs[service] = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}"],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
        )

    def start_all(self) -> None:
        self.work_root.mkdir(parents=True, exist_ok=True)
        for service in SERVICES:
            self.start(service)
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited early:\n{self.log(name)}")
            try:
                if httpx.get(self.base_url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"api not healthy in {timeout_s}s:\n{self.log('api')}")

    def kill(self, service: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[service]
        proc.send_signal(sig)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()

    def log(self, service: str) -> str:
        path = self.root / f"{service}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""
