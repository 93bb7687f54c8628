"""Operator actions on tasks (design §2 recovery/restart tables, §9 actions): pure planning.

`plan()` answers, from the task's current state alone, what an action does: a direct transition,
an action state that a worker's hook resolves, a duplicate, or a refusal naming the states that
would have allowed it.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from shared.domain.errors import Conflict
from shared.domain.states import ACTIONS, FAILED, TERMINAL, TRANSITIONS, TaskState

S = TaskState


class TaskAction(StrEnum):
    """What `POST /tasks/{id}/actions` accepts."""

    RECOVER = "recover"
    RESTART_SETUP = "restart_setup"
    RESTART_CLUSTER = "restart_cluster"
    RESTART_POST_PROCESSING = "restart_post_processing"
    DUPLICATE = "duplicate"
    CANCEL = "cancel"
    HOLD = "hold"
    RELEASE = "release"


class JobAction(StrEnum):
    """What `POST /jobs/{id}/actions` accepts."""

    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESUME = "resume"
    RECOVER_FAILED = "recover_failed"
    THROTTLE = "throttle"
    ACTIVATE = "activate"  # a configuring job: make its tasks and run them
    PURGE = "purge"  # an ended job: delete its logs, kept outputs and work dirs


@dataclass(frozen=True)
class Plan:
    """The effect of an action on one task.

    `target` is the state to compare-and-set to (None for `duplicate`, which makes a new task).
    `hook` is True when a worker must run a task type hook (the target is an action state).
    """

    target: TaskState | None
    hook: bool = False
    duplicate: bool = False


#: Action -> {allowed current state: target state}.
_TABLE: Final[dict[TaskAction, dict[TaskState, TaskState]]] = {
    TaskAction.RECOVER: {
        S.FAILED_SETUP_PREREQUISITES: S.NEW,
        S.FAILED_POST_PROCESSING_PREREQUISITES: S.DATA_READY,
        S.FAILED_TO_SETUP: S.RECOVER_SETUP,
        S.FAILED_ON_CLUSTER: S.RECOVER_CLUSTER,
        S.FAILED_TO_POST_PROCESS: S.RECOVER_POST_PROCESSING,
    },
    TaskAction.RESTART_SETUP: {S.COMPLETED: S.RESTART_SETUP},
    TaskAction.RESTART_CLUSTER: {S.COMPLETED: S.RESTART_CLUSTER},
    TaskAction.RESTART_POST_PROCESSING: {S.COMPLETED: S.RESTART_POST_PROCESSING},
    TaskAction.CANCEL: {
        s: S.TERMINATED
        for s, dsts in TRANSITIONS.items()
        if S.TERMINATED in dsts and s not in TERMINAL
    },
    TaskAction.HOLD: {S.NEW: S.ON_HOLD},
    TaskAction.RELEASE: {S.ON_HOLD: S.NEW},
}


#: Why an action is refused on a task superseded by its resubmitted clone, counted across
#: tasks (a global fix); the single-task refusal names the clone (`shared.operations.lineage`).
SUPERSEDED: Final = "the task was resubmitted: its clone carries its input on"


def runs_again(action: TaskAction) -> bool:
    """Whether `action` could make a task work again (every action but `cancel`): refused on a
    task superseded by its resubmitted clone, whose input its clone carries on."""
    return action is not TaskAction.CANCEL


def targets(action: TaskAction) -> dict[TaskState, TaskState]:
    """Each state `action` is accepted in -> the state it moves the task to (not `duplicate`,
    which moves nothing)."""
    return dict(_TABLE[action])


def allowed_states(action: TaskAction) -> list[TaskState]:
    """The current states from which `action` is accepted, sorted."""
    if action is TaskAction.DUPLICATE:
        return sorted(TERMINAL)
    return sorted(_TABLE[action])


def plan(action: TaskAction, current: TaskState, task_id: str = "TASK") -> Plan:
    """What `action` does to a task in `current`; raises `Conflict` naming the allowed states
    and what can be done with the task (`task_id`) now."""
    if action is TaskAction.DUPLICATE:
        if current in TERMINAL:
            return Plan(target=None, duplicate=True)
    elif current in _TABLE[action]:
        target = _TABLE[action][current]
        return Plan(target=target, hook=target in ACTIONS)
    allowed = ", ".join(s.value for s in allowed_states(action))
    raise Conflict(
        f"cannot {action.value} a task in state {current.value}; allowed in: {allowed}",
        next_step=task_next_step(task_id, current),
    )


def task_next_step(task_id: str, current: TaskState) -> str:
    """What can be done with a task in `current` state, for a refusal."""
    if current is TaskState.COMPLETED:
        return f"run it again from a stage (`vigil restart {task_id} --stage cluster`)"
    if current in FAILED:
        return (
            f"recover it (`vigil recover {task_id}`), or duplicate it (the action duplicate)"
            " to run its input again"
        )
    if current is TaskState.TERMINATED:
        return "it was cancelled for good; duplicate it (the action duplicate) to run its input"
    if current in (TaskState.NEW, TaskState.ON_HOLD):
        return "it has not started: hold, release or cancel it"
    return f"it is under way: wait for it to end, or cancel it (`vigil cancel {task_id}`)"
