"""Prerequisites (design §4): when a required state is met, and when it can no longer be."""

from enum import StrEnum
from typing import Final

from shared.domain.states import FAILED, NORMAL_PATH, TaskState


class Required(StrEnum):
    """The four states a task can wait for another task to reach."""

    QUEUED = "queued"
    DATA_READY = "data_ready"
    COMPLETED = "completed"
    FAILED = "failed"


def _from(state: TaskState) -> frozenset[TaskState]:
    return frozenset(NORMAL_PATH[NORMAL_PATH.index(state) :])


#: The states of the other task in which each requirement is met.
MET: Final[dict[Required, frozenset[TaskState]]] = {
    Required.QUEUED: _from(TaskState.QUEUED),
    Required.DATA_READY: _from(TaskState.DATA_READY),
    Required.COMPLETED: frozenset({TaskState.COMPLETED}),
    Required.FAILED: FAILED,
}

#: The states of the other task in which each requirement can no longer be met.
UNMEETABLE: Final[dict[Required, frozenset[TaskState]]] = {
    Required.QUEUED: FAILED | {TaskState.TERMINATED},
    Required.DATA_READY: FAILED | {TaskState.TERMINATED},
    Required.COMPLETED: FAILED | {TaskState.TERMINATED},
    Required.FAILED: frozenset({TaskState.COMPLETED, TaskState.TERMINATED}),
}


def is_met(required: Required, other: TaskState) -> bool:
    """True when a task in `other` satisfies `required`."""
    return other in MET[required]


#: `met_arrays()`, made once (a worker's move passes them with every report).
_MET_ARRAYS: Final = tuple(sorted(s.value for s in MET[r]) for r in Required)


def met_arrays() -> list[list[str]]:
    """The MET sets as SQL arrays, in the order queued, data_ready, completed, failed (not
    to be changed: the same lists each call)."""
    return list(_MET_ARRAYS)


def unmet_sql(stage: str, task: str = "t.id", first: int = 2) -> str:
    """SQL that is true when `task` has a prerequisite of `stage` not met yet.

    Its four array parameters, from `$first` on, are `met_arrays()`. A failed task meets
    `failed` only once the triage decided it stays failed.
    """
    if stage not in ("setup", "post_processing"):
        raise ValueError(f"no prerequisites at stage {stage!r}")
    q, d, c, f = (f"${first + i}::task_state[]" for i in range(4))
    return (
        "EXISTS (SELECT 1 FROM task_prerequisites p JOIN tasks o ON o.id = p.on_task_id"
        f" WHERE p.task_id = {task} AND p.stage = '{stage}' AND NOT ("
        f"(p.required = 'queued' AND o.state = ANY({q}))"
        f" OR (p.required = 'data_ready' AND o.state = ANY({d}))"
        f" OR (p.required = 'completed' AND o.state = ANY({c}))"
        f" OR (p.required = 'failed' AND o.state = ANY({f}) AND o.decided)))"
    )
