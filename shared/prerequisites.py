"""Prerequisites (design §4): when a required state is met, and when it can no longer be."""

from enum import StrEnum
from typing import Final

from shared.states import FAILED, NORMAL_PATH, TaskState


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


def met_arrays() -> list[list[str]]:
    """The MET sets as SQL arrays, in the order queued, data_ready, completed, failed."""
    return [sorted(s.value for s in MET[r]) for r in Required]
