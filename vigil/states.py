"""The job and task state names the client needs to know when something has ended.

Kept apart from `shared.domain.states` so the client imports nothing of the services' (database and
broker libraries); a unit test keeps these sets equal to the server's.
"""

from typing import Final

_STAGES: Final = ("setup", "cluster", "post_processing")

#: Job states in which nothing more happens unless someone acts (appends, recovers).
JOB_FINAL: Final = frozenset({"completed", "failed", "cancelled"})

#: Task states that are failures (an operator may recover them).
TASK_FAILED: Final = frozenset(
    {
        "failed_to_setup",
        "failed_on_cluster",
        "failed_to_post_process",
        "failed_setup_prerequisites",
        "failed_post_processing_prerequisites",
    }
)

#: Task states a task rests in until someone acts on it.
TASK_TERMINAL: Final = TASK_FAILED | {"completed", "terminated"}

#: Every task state (`vigil tasks --state` refuses others before asking).
TASK_STATES: Final = TASK_TERMINAL | {
    "new",
    "on_hold",
    "setting_up",
    "queued",
    "on_cpu",
    "data_ready",
    "post_processing",
    *(f"{kind}_{stage}" for kind in ("recover", "restart") for stage in _STAGES),
    *(f"{kind}_{stage}" for kind in ("recovering", "restarting") for stage in _STAGES),
}


def done_and_total(counts: dict[str, int]) -> tuple[int, int]:
    """From a job's `counts` (tasks per state): how many tasks rest, out of how many."""
    done = sum(n for state, n in counts.items() if state in TASK_TERMINAL)
    return done, sum(counts.values())
