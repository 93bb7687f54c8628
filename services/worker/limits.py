"""What one command may use: its job's `policy.limits`, else this worker's defaults."""

from typing import Final

import psutil

from shared.domain.policy import Limits
from shared.host.cgroups import CONTROLLERS, Cgroups, TaskLimits

#: The share of the host's memory one command may take when nobody said otherwise.
HOST_SHARE: Final = 0.9


def default_memory_mb(configured: int | None) -> int:
    """`VIGIL_JOB_MEMORY_MB` as set (0: no limit), else `HOST_SHARE` of this host's memory."""
    if configured is not None:
        return configured
    return int(psutil.virtual_memory().total * HOST_SHARE) // 2**20


def resolve(asked: Limits, memory_mb: int, cpus: float, pids: int) -> TaskLimits:
    """The job's limits where it gives them, else the worker's (0: none)."""
    memory = asked.memory_mb if asked.memory_mb is not None else memory_mb
    cpu = asked.cpus if asked.cpus is not None else cpus
    processes = asked.pids if asked.pids is not None else pids
    return TaskLimits(
        memory_bytes=memory * 2**20 if memory else None,
        cpus=cpu or None,
        pids=processes or None,
    )


def enforced(cgroups: Cgroups | None) -> str:
    """What this host can enforce of a task's limits, said once at start."""
    if cgroups is None or not cgroups.limitable:
        return "task limits (memory, CPUs, processes) are not enforced here: no usable cgroups"
    where = [f"{c} (cgroup v2)" for c in sorted(cgroups.v2_controllers)]
    where += [f"{c} (cgroup v1)" for c, _ in cgroups.v1_roots]
    missing = sorted(set(CONTROLLERS) - cgroups.limitable)
    said = f"task limits enforced by: {', '.join(where)}"
    return said + (f"; not enforced: {', '.join(missing)}" if missing else "")
