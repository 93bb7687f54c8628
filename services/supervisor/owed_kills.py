"""Kills owed: commands that PostgreSQL says nobody runs any more, and nobody has seen end.

Whoever ends a running task without being its command's parent (a cancel, a job's or an
emergency stop's, a task declared lost by the reaper or by a worker that stopped or no longer
drove it, a worker failing while it drove it) closes its cluster attempt without `reaped_at`
(`attempts_repo.KILL_OWED_CLASSES`), and most of them send this host's supervisor a `KillTask`.
That order can be lost for good: dead-lettered after its deliveries failed
(`services/scheduler/dead_letters.py` records it), or never sent by a path that has none. So at
every reconcile the supervisor reads the attempts of its host closed that way and not reaped,
kills whatever of each command still runs, and records `reaped_at` once nothing of it does
(what the triage waits for before it resubmits a lost task: `services/scheduler/triage.py`).
A `KillTask` that does arrive only makes it sooner; a kill owed is done within `reconcile_s`
whatever became of its order.

A command is found by everything that names it: its leader (the pid and create time the task
row holds), its process group, its cgroup (`<task>.<claim>`) and `VIGIL_MARK` (task and claim)
in /proc. Each of them identifies it for certain, so nothing else is ever killed: a pid whose
create time is unknown (the task ran again since) is only used when it names no process any
more (a group of that id is then the command's). A command that dropped its mark and its
cgroup, whose leader is gone and whose create time is unknown, cannot be found by anyone; it
is taken as gone.
"""

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shared.host import cgroups as cgroup_files
from shared.host import processes
from shared.host.cgroups import Cgroups
from shared.host.marks import marked_processes
from shared.store import attempts_repo
from shared.store.attempts_repo import OwedKill
from shared.store.db import Pool

logger = logging.getLogger(__name__)

#: How long a round waits for what it killed to be gone before it records it (else the next
#: round looks again), and how often it looks meanwhile.
SETTLE_S: Final = 1.0
_LOOK_EVERY_S: Final = 0.02


@dataclass(eq=False)
class _Command:
    """What may be left of one owed command on this host."""

    owed: OwedKill
    cgroup: Path | None
    #: Its processes found by their mark: (pid, create time).
    marked: list[tuple[int, float]] = field(default_factory=list)

    def alive(self) -> bool:
        owed = self.owed
        if owed.created is not None and processes.is_alive(owed.pid, owed.created):
            return True
        if processes.names(owed.pid, owed.created) is None and _group_lives(owed.pid):
            return True  # its leader is gone, not its group
        if self.cgroup is not None and cgroup_files.procs(self.cgroup):
            return True
        return any(processes.is_alive(pid, created) for pid, created in self.marked)

    def kill(self, cgroups: Cgroups | None) -> None:
        owed = self.owed
        if processes.names(owed.pid, owed.created) is not False:  # its leader's, or orphans
            processes.kill_group(owed.pid, signal.SIGKILL)
        if cgroups is not None and owed.claim is not None:
            cgroups.kill(owed.task_id, owed.claim)
        for pid, created in self.marked:
            if processes.is_alive(pid, created):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def _group_lives(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def kill_owed(
    pool: Pool,
    namespace: str,
    host_id: str,
    cgroups: Cgroups | None,
    settle_s: float = SETTLE_S,
) -> list[OwedKill]:
    """Kill what is left of every command owed a kill on this host, and record each one gone
    (`reaped_at`) once nothing of it runs; returns those recorded. Idempotent: one not gone
    within `settle_s` of its kill is looked at again by the next round."""
    async with pool.acquire() as conn:
        owed = await attempts_repo.kills_owed(conn, host_id)
    if not owed:
        return []
    marked: dict[tuple[str, object], list[tuple[int, float]]] = {}
    for found in marked_processes(namespace, host_id):
        created = processes.create_time(found.pid)
        if created is not None and found.pid != os.getpid():
            marked.setdefault((found.task_id, found.claim), []).append((found.pid, created))
    commands = [
        _Command(
            kill,
            cgroups.path(kill.task_id, kill.claim) if cgroups and kill.claim else None,
            marked.get((kill.task_id, kill.claim), []),
        )
        for kill in owed
    ]
    for command in commands:
        if command.alive():
            command.kill(cgroups)
            logger.warning(
                "task %s: its command (pid %d) still ran after its attempt ended as %s: killed",
                command.owed.task_id,
                command.owed.pid,
                command.owed.failure_class,
                extra={"task_id": command.owed.task_id},
            )
    gone = await _gone(commands, settle_s)
    for command in commands:
        if command not in gone:
            logger.warning("task %s: its command is not gone yet", command.owed.task_id)
    async with pool.acquire() as conn:
        for command in gone:
            await attempts_repo.mark_reaped(conn, command.owed.task_id, command.owed.pid)
    return [command.owed for command in gone]


async def _gone(commands: list[_Command], within_s: float) -> list[_Command]:
    """Those of `commands` of which nothing runs, once all are or `within_s` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        left = [command for command in commands if command.alive()]
        if not left or loop.time() >= deadline:
            return [command for command in commands if command not in left]
        await asyncio.sleep(_LOOK_EVERY_S)  # no event to wait on: most are not our children
