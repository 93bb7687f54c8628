"""Pilots, pure: a pilot's host id, its state from the batch system's, how many
more the pool needs, and how many of those it asked for are no longer needed."""

import math
import re
from typing import Final

#: Slurm's job states that mean the pilot still waits for its allocation, or runs.
_PENDING: Final = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
_RUNNING: Final = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING"})


def host_id(batch_job_id: str, prefix: str = "pilot") -> str:
    """The host id of the pilot that runs as batch job `batch_job_id`."""
    return f"{prefix}-{re.sub(r'[^a-z0-9-]', '-', batch_job_id.lower())}"


def state_of(batch_state: str | None) -> str:
    """A pilot's state from its batch job's (None: the batch system no longer lists it)."""
    if batch_state is None:
        return "ended"
    if batch_state in _PENDING:
        return "pending"
    if batch_state in _RUNNING:
        return "running"
    return "ended"


def more_needed(waiting_cpus: float, pilot_cpus: int, starting: int, live: int, most: int) -> int:
    """How many pilots to ask for now: enough for the CPUs that work waiting for a host
    needs (`waiting_cpus`), less those already starting, within `most` pilots alive."""
    if waiting_cpus <= 0:
        return 0
    needed = math.ceil(waiting_cpus / pilot_cpus) - starting
    return max(0, min(needed, most - live))


def surplus(waiting_cpus: float, pilot_cpus: int, starting: int) -> int:
    """How many of the `starting` pilots the pool asked for (not yet running) to withdraw:
    those beyond what work waiting for a host needs now (`more_needed`'s count, the other
    way). A job cancelled or finished takes its demand with it, and a pilot that would start
    for nothing is cancelled while it still waits in the batch system."""
    needed = math.ceil(max(waiting_cpus, 0.0) / pilot_cpus)
    return max(0, starting - needed)
