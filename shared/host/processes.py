"""Processes identified by (pid, create time), so that a reused pid is never mistaken or killed.

psutil's read-only methods do not guard against pid reuse, and `is_running()` is True for a
zombie (design §10); these helpers compare the create time and treat zombies as dead. They read
`/proc/<pid>/stat` once per call, with psutil's formula for the create time (boot time +
start time in clock ticks), so the values match those psutil gave: a `psutil.Process` read the
file twice and cost the worker more than its whole exit handling.
"""

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Final

from shared.host import cgroups

#: Create times are floats read from /proc; allow for their rounding.
_CREATE_TIME_TOLERANCE_S = 0.05


def _boot_time() -> float:
    with open("/proc/stat", encoding="ascii") as stat:
        for line in stat:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


_BOOT_TIME: Final = _boot_time()
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _state_and_create_time(pid: int) -> tuple[str, float] | None:
    """(state letter, create time) of `pid` from /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(b")") + 2 :].split()  # after the command name, which may hold ")"
    return fields[0].decode(), _BOOT_TIME + int(fields[19]) / _CLOCK_TICKS


def create_time(pid: int) -> float | None:
    """The create time of `pid`, or None if there is no such process."""
    found = _state_and_create_time(pid)
    return found[1] if found is not None else None


def is_alive(pid: int, created: float) -> bool:
    """True when `pid` is still the process created at `created` and not a zombie (or dead)."""
    found = _state_and_create_time(pid)
    if found is None:
        return False
    state, started = found
    return abs(started - created) < _CREATE_TIME_TOLERANCE_S and state not in ("Z", "X")


def run_state(pid: int, created: float) -> str | None:
    """The state letter of `pid` (`R`, `S`, `T` for stopped by a signal...) when it is still
    the process created at `created`, else None."""
    found = _state_and_create_time(pid)
    if found is None or abs(found[1] - created) >= _CREATE_TIME_TOLERANCE_S:
        return None
    return found[0]


def names(pid: int, created: float | None) -> bool | None:
    """Whether `pid` names the process created at `created`, alive or a zombie not yet reaped
    by its parent (True), another process or one of unknown create time (False), or no
    process at all (None: then a process group of that id can only be what is left of it,
    since the kernel gives no process the id of a group that still exists)."""
    found = create_time(pid)
    if found is None:
        return None
    return created is not None and abs(found - created) < _CREATE_TIME_TOLERANCE_S


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal the whole process group `pgid`; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_group_of(pid: int, created: float, sig: int = signal.SIGKILL) -> bool:
    """Kill the process group led by `pid` if `pid` is still the process created at `created`.

    Our commands lead their own session (and group), so pgid == pid. When the leader is
    gone, its group may still hold children: they are killed too if the group exists.
    """
    if is_alive(pid, created) or create_time(pid) is None:
        return kill_group(pid, sig)
    return False  # the pid now belongs to an unrelated process


def exit_waiter(pid: int, created: float) -> Awaitable[None] | None:
    """An awaitable that completes when process `pid` (created at `created`) exits.

    Uses a pidfd watched by the event loop (notified, not polled); works for processes that
    are not our children. None when the process is already gone.
    """
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if not is_alive(pid, created):  # the pidfd may name a newer process with a reused pid
        os.close(fd)
        return None
    done: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        if not done.done():
            done.set_result(None)

    def on_cancel(fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(fd)
                os.close(fd)

    loop.add_reader(fd, on_readable)
    done.add_done_callback(on_cancel)
    return done


def signal_tree(pid: int, created: float, cgroup: Path | None, sig: int) -> bool:
    """Signal the command's whole tree: its cgroup (if any) and its process group.

    Returns whether anything was signalled. A SIGKILL of a cgroup goes through `cgroup.kill`,
    which also reaches processes forked meanwhile.
    """
    hit = kill_group_of(pid, created, sig)
    members = cgroups.procs(cgroup) if cgroup is not None else []
    if members and sig == signal.SIGKILL and cgroup is not None:
        (cgroup / "cgroup.kill").write_text("1")
        return True
    for member in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, sig)
            hit = True
    return hit


def tree_alive(pid: int, created: float, cgroup: Path | None) -> bool:
    """Whether the leader or anything in the command's cgroup or process group still runs."""
    if is_alive(pid, created) or (cgroup is not None and cgroups.procs(cgroup)):
        return True
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def terminate_tree(pid: int, created: float, cgroup: Path | None, grace_s: float) -> None:
    """SIGTERM the tree, give it `grace_s` to exit, then SIGKILL what is left."""
    signal_tree(pid, created, cgroup, signal.SIGTERM)
    signal_tree(pid, created, cgroup, signal.SIGCONT)  # a stopped process cannot handle TERM
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while loop.time() < deadline and tree_alive(pid, created, cgroup):  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # no event to wait on: a pidfd covers the leader only
    signal_tree(pid, created, cgroup, signal.SIGKILL)
