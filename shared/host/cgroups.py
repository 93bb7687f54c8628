"""A cgroup (v2) per running command, so that its whole tree can be killed or frozen, and
limited in memory, CPU and processes.

A process group can be left (`setsid`); a cgroup cannot. Where cgroup v2 is mounted and
writable, the worker starts each command inside `<root>/<task id>.<claim>`; the supervisor
kills through `cgroup.kill` and suspends through `cgroup.freeze`. Where it is not (no v2 mount,
no permission, kernel < 5.14 without `cgroup.kill`), `detect()` gives None and everything falls
back to process groups. Worker and supervisor of one host compute the same paths.

Limits (`TaskLimits`) are set by the controller that has them: the v2 cgroup's own
`memory.max`, `pids.max` and `cpu.max` where the unified hierarchy offers the controller to
Vigil's root, else a cgroup of the same name in that controller's v1 hierarchy (a hybrid host,
as our CI machines: v2 without controllers, v1 `memory`, `pids` and `cpu` beside it), which the
command joins too. A command killed for going over its own memory limit is told apart from one
killed from outside by the cgroup's own counts (`over_memory`).
"""

import contextlib
import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from uuid import UUID

logger = logging.getLogger(__name__)

_OFF = "off"


def _v2_mount() -> Path | None:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    return None


def slow_moves_hint(mounts: str | None = None) -> str | None:
    """What to do when moving a process into a cgroup is slow, or None when it is not.

    Without the `favordynmods` mount option, each move waits for an RCU grace period: 5-20 ms
    on the 2-core VMs we measure on, 0.1 ms with it (kernel 6.0 and later). That wait sits
    between a command's spawn and its start. The option makes forks and exits slightly
    dearer, which a host that starts a command per task can well afford. `mounts`: the text
    of /proc/self/mounts (read when not given)."""
    if mounts is None:
        mounts = Path("/proc/self/mounts").read_text(encoding="utf-8")
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "cgroup2":
            if "favordynmods" in fields[3].split(","):
                return None
            return (
                f"cgroup v2 at {fields[1]} is mounted without favordynmods: moving each "
                "command into its cgroup waits for an RCU grace period (5-20 ms). As root: "
                f"mount -o remount,favordynmods {fields[1]} (scripts/up does)"
            )
    return None


@functools.cache
def moves_are_quick() -> bool:
    """Whether moving a process into a cgroup is quick here (`slow_moves_hint`; looked at
    once): the worker then moves a command on its event loop, not in a thread."""
    return slow_moves_hint() is None


def _own_v2_path() -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as groups:
        for line in groups:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


#: The controllers a task's limits need.
CONTROLLERS: Final = ("memory", "pids", "cpu")
#: The CFS period a CPU limit is expressed in (microseconds).
CPU_PERIOD_US: Final = 100_000


@dataclass(frozen=True)
class TaskLimits:
    """What one command may use: bytes of memory, CPUs (1.5: one and a half), processes and
    threads. None: no limit of that kind."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None

    def v2_files(self) -> dict[str, str]:
        """The files of a v2 cgroup that set them, with their values."""
        files = {}
        if self.memory_bytes is not None:
            files["memory.max"] = str(self.memory_bytes)
            files["memory.swap.max"] = "0"
        if self.pids is not None:
            files["pids.max"] = str(self.pids)
        if self.cpus is not None:
            files["cpu.max"] = f"{round(self.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}"
        return files

    def v1_files(self, controller: str) -> dict[str, str]:
        """The files of a v1 cgroup of `controller` that set them (in this order)."""
        if controller == "memory" and self.memory_bytes is not None:
            value = str(self.memory_bytes)  # swap too: memsw is set after (it must be >= memory)
            return {"memory.limit_in_bytes": value, "memory.memsw.limit_in_bytes": value}
        if controller == "pids" and self.pids is not None:
            return {"pids.max": str(self.pids)}
        if controller == "cpu" and self.cpus is not None:
            quota = round(self.cpus * CPU_PERIOD_US)
            return {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": str(quota)}
        return {}


def _v1_mounts(mounts: str) -> dict[str, Path]:
    """controller -> where its v1 hierarchy is mounted (`/proc/self/mounts` text)."""
    found: dict[str, Path] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "cgroup":
            for option in fields[3].split(","):
                if option in CONTROLLERS:
                    found.setdefault(option, Path(fields[1]))
    return found


def _own_v1_paths() -> dict[str, str]:
    """controller -> this process's cgroup in that v1 hierarchy."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as groups:
        for line in groups:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(","):
                if name in CONTROLLERS:
                    paths[name] = path
    return paths


def _limiters(root: Path, name: str) -> tuple[frozenset[str], tuple[tuple[str, Path], ...]]:
    """(the controllers the v2 `root` gives its children, the v1 roots of the others)."""
    offered = set()
    with contextlib.suppress(OSError):
        # The parent passes its controllers down only if no process lives in it (a systemd
        # unit with `Delegate=` and `DelegateSubgroup=`: deploy/systemd); else this fails.
        parent = set((root.parent / "cgroup.controllers").read_text().split())
        if wanted := parent & set(CONTROLLERS):
            _write(root.parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        offered = set((root / "cgroup.controllers").read_text().split()) & set(CONTROLLERS)
    if offered:  # give them to the task cgroups (best effort: a delegation may forbid it)
        enable = " ".join(f"+{c}" for c in sorted(offered))
        if not _write(root / "cgroup.subtree_control", enable):
            offered = set()
        else:
            offered &= set((root / "cgroup.subtree_control").read_text().split())
    v1: list[tuple[str, Path]] = []
    with contextlib.suppress(OSError):
        mounts = _v1_mounts(Path("/proc/self/mounts").read_text(encoding="utf-8"))
        own = _own_v1_paths()
        for controller in CONTROLLERS:
            if controller in offered or controller not in mounts:
                continue
            where = mounts[controller] / own.get(controller, "/").lstrip("/") / name
            try:
                where.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                logger.info("cgroup v1 %s unusable for limits: %s", controller, exc)
                continue
            v1.append((controller, where))
    return frozenset(offered), tuple(v1)


@dataclass(frozen=True)
class Cgroups:
    """The directory under which this host's task cgroups live, and where limits are set."""

    root: Path
    #: Controllers of the unified hierarchy that the task cgroups have (their limits are set
    #: there).
    v2_controllers: frozenset[str] = frozenset()
    #: (controller, this host's root in its v1 hierarchy) for the others that exist.
    v1_roots: tuple[tuple[str, Path], ...] = ()

    @property
    def limitable(self) -> frozenset[str]:
        """The controllers whose limits this host can set."""
        return self.v2_controllers | {controller for controller, _ in self.v1_roots}

    @classmethod
    def detect(cls, namespace: str, configured: str = "") -> "Cgroups | None":
        """The usable root (`configured`, or found from the mounts), or None to fall back.

        `configured` is a directory, "off", or "" to look for a writable cgroup v2 mount.
        """
        if configured == _OFF:
            return None
        name = f"vigil-{namespace or 'default'}"
        try:
            if configured:
                root = Path(configured)
            else:
                mount = _v2_mount()
                if mount is None:
                    return None
                root = mount / _own_v2_path().lstrip("/") / name
            root.mkdir(parents=True, exist_ok=True)
            if not (root / "cgroup.kill").exists():
                return None
        except OSError as exc:
            logger.info("cgroups unusable, falling back to process groups: %s", exc)
            return None
        if configured:  # a root of the operator's choosing: limits only where it offers them
            return cls(root, _limiters(root, name)[0])
        return cls(root, *_limiters(root, name))

    def path(self, task_id: str, claim: UUID) -> Path:
        return self.root / f"{task_id}.{claim.hex}"

    def limiter_paths(self, task_id: str, claim: UUID) -> list[Path]:
        """The task's cgroups in the v1 hierarchies that hold its limits."""
        return [root / f"{task_id}.{claim.hex}" for _, root in self.v1_roots]

    def create(self, task_id: str, claim: UUID, limits: TaskLimits | None = None) -> Path | None:
        """Make the task's cgroup, limited by `limits`; None if that fails (the command then
        runs without one, and unlimited: the failure is the host's, logged)."""
        path = self.path(task_id, claim)
        limits = limits or TaskLimits()
        try:
            path.mkdir(exist_ok=True)
            for file, value in limits.v2_files().items():
                if file.split(".")[0] in self.v2_controllers:
                    _set(path / file, value)
            for (controller, _), where in zip(
                self.v1_roots, self.limiter_paths(task_id, claim), strict=True
            ):
                files = limits.v1_files(controller)
                if files:
                    where.mkdir(exist_ok=True)
                for file, value in files.items():
                    _set(where / file, value)
        except OSError as exc:
            logger.warning("cannot create cgroup %s with limits %s: %s", path, limits, exc)
            self.remove(task_id, claim)
            return None
        return path

    def over_memory(self, task_id: str, claim: UUID) -> bool:
        """Whether the kernel killed one of the task's processes because the task reached its
        own memory limit. A kill counts only if the cgroup hit its limit too: the host-wide
        OOM killer counts its kills in the victim's cgroup as well, and that is not the
        job's doing (design §5)."""
        if "memory" in self.v2_controllers:
            events = self.path(task_id, claim) / "memory.events"
            return _count(events, "oom_kill") > 0 and _count(events, "oom") > 0
        for (controller, _), where in zip(
            self.v1_roots, self.limiter_paths(task_id, claim), strict=True
        ):
            if controller == "memory":
                if _count(where / "memory.oom_control", "oom_kill") == 0:
                    return False
                # its peak reached its limit (the kernel keeps `failcnt` at 0 here)
                peak = _read_int(where / "memory.max_usage_in_bytes")
                return peak >= _read_int(where / "memory.limit_in_bytes")
        return False

    def kill(self, task_id: str, claim: UUID) -> bool:
        """SIGKILL every process in the task's cgroup; False if it has none (or no cgroup)."""
        path = self.path(task_id, claim)
        if not procs(path):
            return False
        return _write(path / "cgroup.kill", "1")

    def freeze(self, task_id: str, claim: UUID, frozen: bool) -> bool:
        """Freeze (or thaw) the whole tree; False if the task has no cgroup."""
        return _write(self.path(task_id, claim) / "cgroup.freeze", "1" if frozen else "0")

    def remove(self, task_id: str, claim: UUID) -> None:
        """Remove the task's cgroups once empty (a cgroup with processes stays)."""
        for path in (self.path(task_id, claim), *self.limiter_paths(task_id, claim)):
            with contextlib.suppress(OSError):
                path.rmdir()


def procs(path: Path) -> list[int]:
    """The pids in cgroup `path` (empty if it does not exist)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _put(path: Path, value: str) -> None:
    """Write `value` to the cgroup file `path`, which must exist (a cgroup's files are made
    with it: no `O_CREAT`); `FileNotFoundError` if it does not. One open, write and close."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _set(path: Path, value: str) -> None:
    """Write a limit; a file this kernel lacks (no swap accounting, say) is skipped."""
    with contextlib.suppress(FileNotFoundError):
        _put(path, value)


def _count(path: Path, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (0 if absent or unreadable)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _read_int(path: Path) -> int:
    """A one-number cgroup file (0 if absent or unreadable)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _write(path: Path, value: str) -> bool:
    try:
        _put(path, value)
    except OSError:
        return False
    return True


def join(path: Path, pid: int, limiters: Iterable[Path] = ()) -> bool:
    """Move process `pid` into cgroup `path` and the v1 cgroups of its limits (those that
    exist); False (logged) if that fails."""
    try:
        _put(path / "cgroup.procs", str(pid))
        for where in limiters:
            with contextlib.suppress(FileNotFoundError):  # no limit of that controller
                _put(where / "cgroup.procs", str(pid))
    except OSError as exc:
        logger.warning("cannot move pid %d into cgroup %s: %s", pid, path, exc)
        return False
    return True
