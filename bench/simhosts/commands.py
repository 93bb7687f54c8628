"""Commands that run for a while and start no process: the simulated hosts' launcher."""

import asyncio
import contextlib
import itertools
import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from uuid import UUID

from services.worker.launch import Command
from services.worker.process import ExitNote, LineSink

#: Simulated pids are above any kernel's `pid_max` (4,194,304): no signal sent to one by
#: the real code (a reap, a kill order) can reach a real process.
_PID_BASE: Final = 10_000_000
_pids = itertools.count(_PID_BASE)


@dataclass(frozen=True)
class Durations:
    """How long commands run: `fixed:S`, `uniform:A,B` or `exp:MEAN` (seconds)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Durations":
        match = re.fullmatch(r"(fixed|exp):([0-9.]+)|uniform:([0-9.]+),([0-9.]+)", text)
        if match is None:
            raise ValueError(f"durations: fixed:S, uniform:A,B or exp:MEAN, not {text!r}")
        if match.group(1):
            return cls(match.group(1), float(match.group(2)))
        return cls("uniform", float(match.group(3)), float(match.group(4)))

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return rng.expovariate(1 / self.a) if self.a > 0 else 0.0


@dataclass
class SimCommand:
    """A command held at its gate, then "running" for `duration_s`; killed, it exits with
    the signal (negative, as a real one's status)."""

    task_id: str
    claim: UUID
    duration_s: float
    pid: int = field(default_factory=lambda: next(_pids))
    create_time: float = field(default_factory=time.time)
    cgroup: Path | None = None
    exited_at: float | None = None
    _status: int | None = None
    _gate: asyncio.Event = field(default_factory=asyncio.Event)
    _killed: asyncio.Event = field(default_factory=asyncio.Event)
    _running: asyncio.Event = field(default_factory=asyncio.Event)  # cleared: frozen
    _signal: int = signal.SIGKILL

    def __post_init__(self) -> None:
        self._running.set()

    @property
    def returncode(self) -> int | None:
        return self._status

    async def join_cgroup(self) -> None:
        return None

    def open_gate(self) -> None:
        self._gate.set()

    def stop(self) -> None:
        self.kill(signal.SIGKILL)

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Whether it was killed (not exited already)."""
        if self.exited_at is not None or self._killed.is_set():
            return False
        self._signal = sig
        self._killed.set()
        self._gate.set()
        return True

    def freeze(self, frozen: bool) -> None:
        if frozen:
            self._running.clear()
        else:
            self._running.set()

    async def reaped(self) -> int:
        if self._status is None:
            self._status = -self._signal
            self.exited_at = time.time()
        return self._status

    async def watch(self, sink: LineSink, on_exit: ExitNote) -> int:
        await self._gate.wait()
        left = self.duration_s
        while left > 0 and not self._killed.is_set():
            await self._running.wait()
            began = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._killed.wait(), left)
            left -= time.monotonic() - began
        self._status = -self._signal if self._killed.is_set() else 0
        self.exited_at = time.time()
        await on_exit(self._status)
        return self._status


@dataclass
class SimLaunch:
    """A simulated command made ready: it is one host's from its start to its end."""

    running: dict[str, SimCommand]
    task_id: str
    claim: UUID
    duration_s: float

    async def start(self, script: str, workdir: Path, env: dict[str, str]) -> SimCommand:
        command = SimCommand(self.task_id, self.claim, self.duration_s)
        self.running[self.task_id] = command
        return command

    def end(self, running: object = None) -> bool:
        self.running.pop(self.task_id, None)
        return False


class SimLauncher:
    """Starts simulated commands; `running` is what the host's supervisor may kill."""

    def __init__(self, durations: Durations, rng: random.Random) -> None:
        self.durations, self.rng = durations, rng
        self.running: dict[str, SimCommand] = {}

    def describe(self) -> str:
        return f"simulated: {self.durations.kind} durations, no process"

    async def prepare(self, command: Command) -> SimLaunch:
        duration_s = self.durations.draw(self.rng)
        return SimLaunch(self.running, command.task_id, command.claim, duration_s)

    async def files_group(self, owner_id: str) -> int:
        return os.getegid()

    def kill_all(self) -> int:
        """The fence: every command of the host killed."""
        return sum(command.kill() for command in list(self.running.values()))
