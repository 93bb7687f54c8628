"""Where a task's command runs, and how: the seam between the stage
machine (`stages.py`, `runs.py`) and the host.

The cluster stage asks the worker's `Launcher` to `prepare` a `Command` (whose it is, its work
dir, its limits, its network) and gets a `Launch`: all made ready that holds none of the
host's capacity (a cgroup with its limits, who the command runs as). It then takes the
command's request of the host (`ledger.py`) and `start`s it: a `RunningCommand`, held at its
gate, known to the task row and the supervisor by its pid and the time its process was made.
The stage puts it where its limits hold (`join_cgroup`) while the task is made `on_cpu`, then
opens the gate, or `stop`s it unrun; `watch` feeds its output and returns its exit status;
`Launch.end` cleans up after it, saying whether the kernel killed it for its memory.

The launcher is chosen once, at the worker's start, from its settings (`choose`), never per
task:

- `LocalConfined`: a worker that is root (`VIGIL_JOB_ISOLATION` `auto` or `on`) starts the
  command as its owner's uid, in its owner's network namespace with no network, sealed in a
  room of its own (mount, PID and IPC namespaces: the host read-only, its sockets, the homes
  and the rest of the work root out of sight, private temporary dirs, a /proc of its own:
  `confinement.py`), in a cgroup of its own where the host has cgroups. The pid the task row
  and the supervisor know is the room's outer process (bwrap), whose process group holds the
  room's pid 1 and the command: its kills reach the room, and the command's own exit status
  comes through a pipe from pid 1 (`process.reported_status`).
- `LocalUnconfined`: `VIGIL_JOB_ISOLATION=off` (what a pilot started by an unprivileged batch
  user sets), or `auto` on a worker that is not root: the command runs as the worker's own
  user, on its network (what `describe` says at the start), in a cgroup where this
  host's cgroups let the worker make one (under a batch system, the allocation's cgroup is
  the batch system's). `on` on a worker that cannot confine refuses to start
  (`CannotConfine`, before the worker connects to anything).

A container runtime would be a third launcher behind the same protocols. What it would not
find here: the supervisor follows a command by its pid (`WatchProcess`, the task row's `pid`
and `pid_create_time`, its kills and freezes), so it would need to learn the runtime's ways
too.
"""

import functools
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

from services.worker import confinement, process
from services.worker.confinement import Confinement, Network
from services.worker.settings import WorkerSettings
from shared.host.cgroups import Cgroups, TaskLimits
from shared.store import users_repo
from shared.store.db import Pool


@dataclass(frozen=True)
class Command:
    """A task's command as its launcher needs to know it."""

    task_id: str
    claim: UUID
    #: Whose job it is (`users.id`): a confined command runs as their uid.
    owner_id: str
    workdir: Path
    #: What it may reach (`policy.network`).
    network: Network
    #: What it may use (`limits.resolve`).
    limits: TaskLimits


class RunningCommand(Protocol):
    """A command started at its gate, until its exit (`process.Running` on this host)."""

    #: What the task row (`pid`, `pid_create_time`) and the supervisor know it by.
    pid: int
    create_time: float
    #: The cgroup holding its processes, once joined (None: none).
    cgroup: Path | None
    #: When its exit was seen (epoch seconds; None: not yet).
    exited_at: float | None

    @property
    def returncode(self) -> int | None: ...

    async def join_cgroup(self) -> None:
        """Put it where its limits hold, while it waits at its gate."""

    def open_gate(self) -> None:
        """Let it run (once its task is durably `on_cpu` under its claim)."""

    def stop(self) -> None:
        """Never let it run, and kill whatever was started."""

    async def reaped(self) -> int:
        """Wait for its end (after `stop`); its exit status."""
        ...

    def watch(self, sink: process.LineSink, on_exit: process.ExitNote) -> Awaitable[int]:
        """Feed its output to `sink` until it exits; its exit status (negative: the signal
        that killed it). `on_exit` is told the status as soon as it is known."""
        ...


class Launch(Protocol):
    """A command made ready to start: nothing started yet, none of the host's capacity held."""

    def start(self, script: str, workdir: Path, env: dict[str, str]) -> Awaitable[RunningCommand]:
        """Start `bash -c script` in `workdir` with `env`, held at its gate."""
        ...

    def end(self, running: RunningCommand | None = None) -> bool:
        """Clean up after the command (`running`: started, and now ended; None: never
        started, or killed at its gate); whether the kernel killed one of its processes for
        going over its memory limit (asked of every command that ran, whatever its exit)."""
        ...


class Launcher(Protocol):
    """How this worker runs its tasks' commands."""

    def describe(self) -> str:
        """How commands run here, in a few words (said at the worker's start)."""
        ...

    async def prepare(self, command: Command) -> Launch:
        """Make `command` ready to start (its cgroup, who it runs as); cleaned up if this
        fails."""
        ...

    async def files_group(self, owner_id: str) -> int:
        """The group that the commands of `owner_id`'s jobs run with: their job's files are
        readable by it alone (`shared/host/bundle.py`)."""
        ...


@dataclass
class _LocalLaunch:
    """A command of this host made ready: its cgroup (if any), what bash is started through
    (its seal) and what gives its work dir to the uid it runs as (both none when unconfined)."""

    cgroups: Cgroups | None
    task_id: str
    claim: UUID
    cgroup: Path | None = None
    limiters: Sequence[Path] = ()
    sealed: Callable[[int], Sequence[str]] | None = None
    hand_over: Callable[[], None] | None = None

    def start(
        self, script: str, workdir: Path, env: dict[str, str]
    ) -> Coroutine[Any, Any, process.Running]:
        return process.spawn(
            script,
            workdir,
            env,
            self.cgroup,
            sealed=self.sealed,
            limiters=self.limiters,
            prepare=self.hand_over,
        )

    def end(self, running: RunningCommand | None = None) -> bool:
        if self.cgroups is None:
            return False
        # asked of every command that ran: one of its processes killed fails even a command
        # that exits 0 (`shared.domain.outcomes.limit_outcome`)
        ended = running is not None and running.returncode is not None
        over_memory = (
            ended
            and running is not None
            and running.cgroup is not None
            and self.cgroups.over_memory(self.task_id, self.claim)
        )
        self.cgroups.remove(self.task_id, self.claim)
        return over_memory


class _Local:
    """What both local launchers do: a cgroup per command, with its limits, where the host
    has cgroups (`VIGIL_CGROUP_ROOT`)."""

    def __init__(self, cgroups: Cgroups | None) -> None:
        self.cgroups = cgroups

    def _made_ready(self, command: Command) -> _LocalLaunch:
        launch = _LocalLaunch(self.cgroups, command.task_id, command.claim)
        if self.cgroups is not None:
            launch.cgroup = self.cgroups.create(command.task_id, command.claim, command.limits)
            if launch.cgroup:
                launch.limiters = self.cgroups.limiter_paths(command.task_id, command.claim)
        return launch


class LocalUnconfined(_Local):
    """Commands run on this host as the worker's own user, on its network: neither who they
    run as nor what they reach is confined."""

    def describe(self) -> str:
        return f"unconfined: as the worker's own user (uid {os.geteuid()}), on its network"

    async def prepare(self, command: Command) -> _LocalLaunch:
        return self._made_ready(command)

    async def files_group(self, owner_id: str) -> int:
        return os.getegid()


class LocalConfined(_Local):
    """Commands run on this host as their owner's uid, in their owner's network namespace,
    each sealed in a room of its own (`confinement.py`); the work dir given to that uid in the
    spawn's thread."""

    def __init__(
        self, cgroups: Cgroups | None, confinement: Confinement, pool: Pool, work_root: Path
    ) -> None:
        super().__init__(cgroups)
        self.confinement, self.pool, self.work_root = confinement, pool, work_root
        self._job_uids: dict[str, int] = {}  # owner -> users.job_uid (never changes)

    def describe(self) -> str:
        return (
            f"confined: as uid {self.confinement.uid_base} + their owner's number, in their"
            " owner's network namespace, each in a sealed room"
        )

    async def prepare(self, command: Command) -> _LocalLaunch:
        launch = self._made_ready(command)
        try:
            job_uid = await self._job_uid(command.owner_id)
            launch.hand_over = functools.partial(
                self.confinement.hand_over, self.work_root, command.workdir, job_uid
            )
            launch.sealed = self.confinement.sealer(
                self.work_root, command.workdir, job_uid, command.network
            )
        except BaseException:
            launch.end()
            raise
        return launch

    async def files_group(self, owner_id: str) -> int:
        return self.confinement.uid_of(await self._job_uid(owner_id))  # its gid is its uid

    async def _job_uid(self, owner: str) -> int:
        if owner not in self._job_uids:
            async with self.pool.acquire() as conn:
                self._job_uids[owner] = await users_repo.job_uid(conn, owner)
        return self._job_uids[owner]


@dataclass(frozen=True)
class Choice:
    """The launcher a worker's settings make, decided at its start (`choose`)."""

    #: How jobs are confined (None: they are not, `LocalUnconfined`).
    confinement: Confinement | None
    work_root: Path

    def launcher(self, pool: Pool, cgroups: Cgroups | None) -> Launcher:
        """The launcher, once the worker has its database pool and knows its cgroups."""
        if self.confinement is None:
            return LocalUnconfined(cgroups)
        return LocalConfined(cgroups, self.confinement, pool, self.work_root)


def choose(settings: WorkerSettings) -> Choice:
    """Where and how this worker's commands run, from `VIGIL_JOB_ISOLATION`: confined when
    the worker can (`auto`, `on`), unconfined when it cannot (`auto`: said in a warning) or
    must not (`off`). `CannotConfine` when `on` was asked for and it cannot, or confined jobs
    could not reach their work dirs."""
    work_root = Path(settings.work_root)
    sealed = Confinement(
        settings.job_uid_base,
        read_only=settings.read_only_paths(),
        scratch=settings.scratch_paths(),
        tmp_bytes=settings.job_tmp_mb * 1024 * 1024,
    )
    confined = confinement.decide(settings.job_isolation, settings.job_uid_base, sealed)
    confinement.check_reach(confined, work_root)
    return Choice(confined, work_root)
