"""A cgroup (v2) per running command, so that its whole tree can be killed or frozen.

A process group can be left (`setsid`); a cgroup cannot. Where cgroup v2 is mounted and
writable, the worker starts each command inside `<root>/<task id>.<claim>`; the supervisor
kills through `cgroup.kill` and suspends through `cgroup.freeze`. Where it is not (no v2 mount,
no permission, kernel < 5.14 without `cgroup.kill`), `detect()` gives None and everything falls
back to process groups. Worker and supervisor of one host compute the same paths.
"""

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
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


def _own_v2_path() -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as groups:
        for line in groups:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


@dataclass(frozen=True)
class Cgroups:
    """The directory under which this host's task cgroups live."""

    root: Path

    @classmethod
    def detect(cls, namespace: str, configured: str = "") -> "Cgroups | None":
        """The usable root (`configured`, or found from the mounts), or None to fall back.

        `configured` is a directory, "off", or "" to look for a writable cgroup v2 mount.
        """
        if configured == _OFF:
            return None
        try:
            if configured:
                root = Path(configured)
            else:
                mount = _v2_mount()
                if mount is None:
                    return None
                root = mount / _own_v2_path().lstrip("/") / f"vigil-{namespace or 'default'}"
            root.mkdir(parents=True, exist_ok=True)
            if not (root / "cgroup.kill").exists():
                return None
        except OSError as exc:
            logger.info("cgroups unusable, falling back to process groups: %s", exc)
            return None
        return cls(root)

    def path(self, task_id: str, claim: UUID) -> Path:
        return self.root / f"{task_id}.{claim.hex}"

    def create(self, task_id: str, claim: UUID) -> Path | None:
        """Make the task's cgroup; None if that fails (the command then runs without one)."""
        path = self.path(task_id, claim)
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            logger.warning("cannot create cgroup %s: %s", path, exc)
            return None
        return path

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
        """Remove the task's cgroup once empty (a cgroup with processes stays)."""
        with contextlib.suppress(OSError):
            self.path(task_id, claim).rmdir()


def procs(path: Path) -> list[int]:
    """The pids in cgroup `path` (empty if it does not exist)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def join(path: Path, pid: int) -> bool:
    """Move process `pid` into cgroup `path`; False (logged) if that fails."""
    try:
        (path / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        logger.warning("cannot move pid %d into cgroup %s: %s", pid, path, exc)
        return False
    return True
