"""What one command may use: its job's request (what its host holds for it), narrowed
by its `policy.limits`; what neither names, this worker's defaults."""

from typing import Final, TypeVar

import psutil

from shared.domain.policy import Limits
from shared.domain.scheduling.resources import Resources
from shared.host.cgroups import CONTROLLERS, Cgroups, TaskLimits

N = TypeVar("N", int, float)

#: The share of the host's memory one command may take when nobody said otherwise.
HOST_SHARE: Final = 0.9


def default_memory_mb(configured: int | None) -> int:
    """`VIGIL_JOB_MEMORY_MB` as set (0: no limit), else `HOST_SHARE` of this host's memory."""
    if configured is not None:
        return configured
    return int(psutil.virtual_memory().total * HOST_SHARE) // 2**20


def resolve(
    asked: Limits, request: Resources, memory_mb: int, cpus: float, pids: int
) -> TaskLimits:
    """The command's limits (0: none).

    CPUs and memory are the request's, what the scheduler placed the task by: a command that
    used more would take it from the other tasks of its host. `policy.limits` may only narrow
    them (the smaller wins), and stands alone for what the request does not name (memory when
    it asks none, processes); the worker's defaults come last. The request always names CPUs
    (1 by default), so `VIGIL_JOB_CPUS` counts only for a request of none."""
    memory = _smaller(request.memory_mb or None, asked.memory_mb)
    memory = memory if memory is not None else memory_mb
    cpu = _smaller(request.millicpus / 1000 or None, asked.cpus)
    cpu = cpu if cpu is not None else cpus
    processes = asked.pids if asked.pids is not None else pids
    return TaskLimits(
        memory_bytes=memory * 2**20 if memory else None,
        cpus=cpu or None,
        pids=processes or None,
    )


def _smaller(request: N | None, policy: N | None) -> N | None:
    """The smaller of what the request and the policy name (None: neither names it)."""
    named = [value for value in (request, policy) if value is not None]
    return min(named) if named else None


def enforced(cgroups: Cgroups | None) -> str:
    """What this host can enforce of a task's limits, said once at start."""
    if cgroups is None or not cgroups.limitable:
        return "task limits (memory, CPUs, processes) are not enforced here: no usable cgroups"
    where = [f"{c} (cgroup v2)" for c in sorted(cgroups.v2_controllers)]
    where += [f"{c} (cgroup v1)" for c, _ in cgroups.v1_roots]
    missing = sorted(set(CONTROLLERS) - cgroups.limitable)
    said = f"task limits enforced by: {', '.join(where)}"
    return said + (f"; not enforced: {', '.join(missing)}" if missing else "")
