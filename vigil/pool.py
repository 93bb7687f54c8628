"""How the command shows the shared pool: amounts of resources, a job's priority
and request, what a host has free, and why a task or a job waits (`vigil why`, `status`).

Plain text, one fact a line; everything from the API goes through `render.printable`. A
reason's `detail` is shown key by key, whatever the reason (the API may add reasons and
numbers: they are shown as they come, not dropped).
"""

import re
from collections.abc import Mapping
from typing import Any, Final

from vigil.text import counts_text, printable, when

#: A job's request when it names none (`DEFAULT_REQUEST` of the planner): 1 CPU.
DEFAULT_RESOURCES: Final = {"cpus": 1, "memory_mb": 0, "gpus": 0}
_ISO_TIME_RE: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def memory(mb: float) -> str:
    """`512 MiB`, `4 GiB`, `1.5 GiB`: memory as people read it."""
    return f"{mb:g} MiB" if mb < 1024 else f"{mb / 1024:.3g} GiB"


def number(value: Any) -> str | None:
    """`2`, `0.5`, `12,345`: a share or a usage as people read it (None if not a number)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _plural(count: float, word: str) -> str:
    return f"{count:g} {word}" + ("" if count == 1 else "s")


def _gpu_count(gpus: Any) -> int:
    # A request or a reason counts GPUs; a host lists its devices' ids.
    return len(gpus) if isinstance(gpus, list) else int(gpus or 0)


def resources(amount: Mapping[str, Any]) -> str:
    """`2 cpus, 4 GiB, 1 gpu`: CPUs always, memory and GPUs when there are some."""
    parts = [_plural(float(amount.get("cpus") or 0), "cpu")]
    if amount.get("memory_mb"):
        parts.append(memory(float(amount["memory_mb"])))
    if gpus := _gpu_count(amount.get("gpus")):
        parts.append(_plural(gpus, "gpu"))
    return ", ".join(parts)


def is_default(amount: Mapping[str, Any] | None) -> bool:
    """Whether a job's `resources` is the default request (1 CPU, nothing else), or absent."""
    if not amount:
        return True
    return (
        float(amount.get("cpus") or 0) == DEFAULT_RESOURCES["cpus"]
        and not amount.get("memory_mb")
        and not _gpu_count(amount.get("gpus"))
    )


def request_line(job: Mapping[str, Any]) -> str | None:
    """`priority 5; each task needs 2 cpus, 4 GiB`: what is not the default of a job's
    priority and request, or None when both are."""
    parts = []
    if job.get("priority"):
        parts.append(f"priority {printable(job['priority'])}")
    if not is_default(job.get("resources")):
        parts.append(f"each task needs {resources(job['resources'])}")
    return "; ".join(parts) or None


# -- hosts -------------------------------------------------------------------------------------


def host_cpus(host: Mapping[str, Any]) -> str | None:
    """`1.5/4`: the host's free CPUs out of its capacity (None when it advertises none)."""
    capacity, free = host.get("capacity") or {}, host.get("free") or {}
    if not capacity.get("cpus"):
        return None
    return f"{float(free.get('cpus') or 0):g}/{float(capacity['cpus']):g}"


def host_memory(host: Mapping[str, Any]) -> str | None:
    """`3 GiB/8 GiB`: free memory out of the host's capacity."""
    capacity, free = host.get("capacity") or {}, host.get("free") or {}
    if not capacity.get("memory_mb"):
        return None
    return f"{memory(float(free.get('memory_mb') or 0))}/{memory(float(capacity['memory_mb']))}"


def host_gpus(host: Mapping[str, Any]) -> str | None:
    """`1/2 (1)`: free GPUs out of the host's, and the free devices' ids."""
    capacity, free = host.get("capacity") or {}, host.get("free") or {}
    total = _gpu_count(capacity.get("gpus"))
    if not total:
        return None
    free_gpus = free.get("gpus")
    ids = f" ({','.join(map(printable, free_gpus))})" if isinstance(free_gpus, list) else ""
    return f"{_gpu_count(free_gpus)}/{total}" + (ids if free_gpus else "")


# -- why it waits ------------------------------------------------------------------------------


def detail_value(value: Any) -> str | None:
    """One number of a reason's detail as text (None: nothing to show)."""
    if value is None or value == "" or value == [] or value == {}:
        return None
    if isinstance(value, Mapping) and "cpus" in value:
        return resources(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ", ".join(printable(item) for item in value)
    if isinstance(value, str) and _ISO_TIME_RE.match(value):
        return when(value)
    return printable(value)


def detail_lines(detail: Mapping[str, Any] | None) -> list[str]:
    """`closest host: h-1`: a reason's numbers, one a line, by their name."""
    lines = []
    for key, value in (detail or {}).items():
        shown = detail_value(value)
        if shown is not None:
            lines.append(f"{printable(key).replace('_', ' ')}: {shown}")
    return lines


def reason_text(wait: Mapping[str, Any]) -> str:
    """`fair_share: 3 tasks of other users ahead`: a reason and its message, the label a
    message opens with (`fair share: ...`, `priority: ...`) said once."""
    message = wait.get("message")
    reason = printable(wait.get("reason"))
    if not message:
        return reason
    said = printable(message)
    label = f"{reason.replace('_', ' ')}: "
    return f"{reason}: {said.removeprefix(label)}"


def job_waiting(job: Mapping[str, Any]) -> str | None:
    """`3 task(s): fair_share: ...`: the job's `waiting` in one line (None when nothing
    waits)."""
    wait = job.get("waiting")
    if not wait:
        return None
    return f"{printable(wait.get('tasks'))} task(s): {reason_text(wait)}"


def why_task(task: Mapping[str, Any]) -> list[str]:
    """What `vigil why TASK` prints: the task's state and, when it waits, why."""
    where = f" on {printable(task['host'])}" if task.get("host") else ""
    head = (
        f"task {printable(task.get('id'))} (job {printable(task.get('job_id'))},"
        f" index {printable(task.get('index'))}) is {printable(task.get('state'))}{where}"
    )
    wait = task.get("waiting_reason")
    if not wait:
        return [f"{head}: not waiting"]
    return [f"{head}, waiting: {reason_text(wait)}"] + [
        f"  {line}" for line in detail_lines(wait.get("detail"))
    ]


def why_job(job: Mapping[str, Any]) -> list[str]:
    """What `vigil why JOB` prints: the job's state and tasks per state, its priority and
    request when not the default, and why its waiting tasks wait (how many, the reason and
    its numbers)."""
    per_state = counts_text(job.get("counts") or {})
    lines = [f"job {printable(job.get('id'))} is {printable(job.get('state'))}: {per_state}"]
    if request := request_line(job):
        lines.append(request)
    wait = job.get("waiting")
    if wait:
        lines.append(f"{printable(wait.get('tasks'))} task(s) waiting: {reason_text(wait)}")
        lines += [f"  {line}" for line in detail_lines(wait.get("detail"))]
    elif job.get("waiting_on"):
        lines.append(f"waiting on: {printable(job['waiting_on'])}")
    else:
        lines.append("no task waits to start")
    return lines
