"""Task and job states, and the transition tables that PostgreSQL changes are checked against.

Pure data and pure functions: no I/O. The SQL enums in `shared/store/sql/0001_init.sql` mirror these
value sets (a unit test keeps them equal). Every state change in the repositories is a
compare-and-set whose allowed source states come from `sources_for()`.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from shared.domain.errors import InvalidTransition


class TaskState(StrEnum):
    """The lifecycle of one task (design §2)."""

    NEW = "new"  # waiting for setup prerequisites and a release by the scheduler
    ON_HOLD = "on_hold"  # held before setup by an operator
    SETTING_UP = "setting_up"  # setup() runs on a worker
    QUEUED = "queued"  # set up, waiting for a slot to run the command
    ON_CPU = "on_cpu"  # the command runs on a worker host
    DATA_READY = "data_ready"  # the command ended well; waiting for post-processing
    POST_PROCESSING = "post_processing"  # save_results() runs on the same host
    COMPLETED = "completed"  # all three stages done
    FAILED_TO_SETUP = "failed_to_setup"  # setup() raised or returned False
    FAILED_ON_CLUSTER = "failed_on_cluster"  # the command failed, or save_results() said False
    FAILED_TO_POST_PROCESS = "failed_to_post_process"  # save_results() raised
    FAILED_SETUP_PREREQUISITES = "failed_setup_prerequisites"  # can no longer start setup
    FAILED_POST_PROCESSING_PREREQUISITES = "failed_post_processing_prerequisites"
    TERMINATED = "terminated"  # cancelled by a user or revoked by the system
    RECOVER_SETUP = "recover_setup"  # recovery asked, hook not started yet
    RECOVERING_SETUP = "recovering_setup"  # recover_from_setup_failure() runs
    RECOVER_CLUSTER = "recover_cluster"
    RECOVERING_CLUSTER = "recovering_cluster"  # recover_from_cluster_failure() runs
    RECOVER_POST_PROCESSING = "recover_post_processing"
    RECOVERING_POST_PROCESSING = "recovering_post_processing"
    RESTART_SETUP = "restart_setup"  # restart asked, hook not started yet
    RESTARTING_SETUP = "restarting_setup"  # restart_at_setup() runs
    RESTART_CLUSTER = "restart_cluster"
    RESTARTING_CLUSTER = "restarting_cluster"
    RESTART_POST_PROCESSING = "restart_post_processing"
    RESTARTING_POST_PROCESSING = "restarting_post_processing"


class JobState(StrEnum):
    """The state of a whole submission (design §9)."""

    CONFIGURING = "configuring"  # only test tasks run; command, inputs and policy editable
    ACTIVE = "active"  # tasks are being worked on
    SUSPENDED = "suspended"  # no new task is released; running ones go on
    COMPLETED = "completed"  # every task completed
    FAILED = "failed"  # every task is terminal and at least one did not complete
    CANCELLED = "cancelled"  # a user cancelled it


class FailureClass(StrEnum):
    """Why an attempt failed (design §5)."""

    EXIT = "exit"  # non-zero exit, or save_results() returned False
    SIGNAL = "signal"  # killed by a signal nobody in Vigil sent
    LOST = "lost"  # its worker or host died or stopped heartbeating
    HUNG = "hung"  # no sign of life for hang_timeout
    WALLTIME = "walltime"  # ran past its walltime
    ERROR_LOG = "error_log"  # an error/critical/fatal log record was seen
    HOOK = "hook"  # setup()/save_results() or a recovery hook raised
    CANCELLED = "cancelled"  # a user or operator stopped it
    HOST = "host"  # the host's disk refused the task's files (full, over quota, read-only)
    PLATFORM = "platform"  # Vigil's own database went away under the task's bookkeeping
    LIMIT = "limit"  # the kernel killed it for going over the task's own memory limit
    QUOTA = "quota"  # its outputs would take its user over their quota of stored bytes
    CHECKSUM = "checksum"  # an object it names is not the bytes named (sha256), fetched twice


class Stage(StrEnum):
    """The three stages of design §2, plus the action hooks that a worker runs."""

    SETUP = "setup"
    CLUSTER = "cluster"
    POST_PROCESSING = "post_processing"
    HOOK = "hook"  # a recover/restart hook (the action is in the task's state)


S = TaskState

FAILED: Final[frozenset[TaskState]] = frozenset(
    {
        S.FAILED_TO_SETUP,
        S.FAILED_ON_CLUSTER,
        S.FAILED_TO_POST_PROCESS,
        S.FAILED_SETUP_PREREQUISITES,
        S.FAILED_POST_PROCESSING_PREREQUISITES,
    }
)

#: States a task rests in until someone acts on it.
TERMINAL: Final[frozenset[TaskState]] = FAILED | {S.COMPLETED, S.TERMINATED}

#: The normal path, in order.
NORMAL_PATH: Final[tuple[TaskState, ...]] = (
    S.NEW,
    S.SETTING_UP,
    S.QUEUED,
    S.ON_CPU,
    S.DATA_READY,
    S.POST_PROCESSING,
    S.COMPLETED,
)

#: States of the normal path whose `task.<state>` events notify nobody (migrations 0012 and
#: 0014: NOTIFY would serialize the worker's commits); the relay finds them at its poll, and
#: the worker nudges it after a quiet spell (`shared/store/transition_writer.py`).
QUIET: Final[frozenset[TaskState]] = frozenset(
    {S.SETTING_UP, S.QUEUED, S.ON_CPU, S.DATA_READY, S.POST_PROCESSING}
)

#: States in which a worker holds the task (its claim) and a process or hook may be running.
HELD_BY_WORKER: Final[frozenset[TaskState]] = frozenset(
    {
        S.SETTING_UP,
        S.ON_CPU,
        S.POST_PROCESSING,
        S.RECOVERING_SETUP,
        S.RECOVERING_CLUSTER,
        S.RECOVERING_POST_PROCESSING,
        S.RESTARTING_SETUP,
        S.RESTARTING_CLUSTER,
        S.RESTARTING_POST_PROCESSING,
    }
)

#: States that count against a job's `max_in_flight`: released and not resting.
IN_FLIGHT: Final[frozenset[TaskState]] = frozenset(TaskState) - TERMINAL - {S.NEW, S.ON_HOLD}

#: Action states -> (state while the hook runs, state on True, state on False/exception).
ACTIONS: Final[Mapping[TaskState, tuple[TaskState, TaskState, TaskState]]] = {
    S.RECOVER_SETUP: (S.RECOVERING_SETUP, S.NEW, S.FAILED_TO_SETUP),
    S.RECOVER_CLUSTER: (S.RECOVERING_CLUSTER, S.QUEUED, S.FAILED_ON_CLUSTER),
    S.RECOVER_POST_PROCESSING: (
        S.RECOVERING_POST_PROCESSING,
        S.DATA_READY,
        S.FAILED_TO_POST_PROCESS,
    ),
    S.RESTART_SETUP: (S.RESTARTING_SETUP, S.NEW, S.COMPLETED),
    S.RESTART_CLUSTER: (S.RESTARTING_CLUSTER, S.QUEUED, S.COMPLETED),
    S.RESTART_POST_PROCESSING: (S.RESTARTING_POST_PROCESSING, S.DATA_READY, S.COMPLETED),
}


def _action_rows() -> dict[TaskState, frozenset[TaskState]]:
    rows: dict[TaskState, frozenset[TaskState]] = {}
    for action, (running, ok, failed) in ACTIONS.items():
        # An action not yet started can be withdrawn (its worker died); both can be cancelled.
        rows[action] = frozenset({running, failed, S.TERMINATED})
        rows[running] = frozenset({ok, failed, S.TERMINATED})
    return rows


#: Every allowed (source -> destinations) pair of design §2, recovery and restart included.
TRANSITIONS: Final[Mapping[TaskState, frozenset[TaskState]]] = {
    S.NEW: frozenset({S.SETTING_UP, S.ON_HOLD, S.TERMINATED, S.FAILED_SETUP_PREREQUISITES}),
    S.ON_HOLD: frozenset({S.NEW, S.TERMINATED}),
    S.SETTING_UP: frozenset({S.QUEUED, S.FAILED_TO_SETUP, S.TERMINATED}),
    S.QUEUED: frozenset({S.ON_CPU, S.FAILED_ON_CLUSTER, S.TERMINATED}),
    S.ON_CPU: frozenset({S.DATA_READY, S.FAILED_ON_CLUSTER, S.TERMINATED}),
    S.DATA_READY: frozenset(
        {
            S.POST_PROCESSING,
            S.FAILED_POST_PROCESSING_PREREQUISITES,
            S.FAILED_ON_CLUSTER,
            S.TERMINATED,
        }
    ),
    S.POST_PROCESSING: frozenset(
        {S.COMPLETED, S.FAILED_ON_CLUSTER, S.FAILED_TO_POST_PROCESS, S.TERMINATED}
    ),
    S.COMPLETED: frozenset({S.RESTART_SETUP, S.RESTART_CLUSTER, S.RESTART_POST_PROCESSING}),
    S.FAILED_TO_SETUP: frozenset({S.RECOVER_SETUP, S.TERMINATED}),
    S.FAILED_ON_CLUSTER: frozenset({S.RECOVER_CLUSTER, S.TERMINATED}),
    S.FAILED_TO_POST_PROCESS: frozenset({S.RECOVER_POST_PROCESSING, S.TERMINATED}),
    S.FAILED_SETUP_PREREQUISITES: frozenset({S.NEW, S.TERMINATED}),
    S.FAILED_POST_PROCESSING_PREREQUISITES: frozenset({S.DATA_READY, S.TERMINATED}),
    S.TERMINATED: frozenset(),
    **_action_rows(),
}


def allowed(src: TaskState, dst: TaskState) -> bool:
    """True when `src -> dst` is a row of the transition table."""
    return dst in TRANSITIONS[src]


def check_transition(src: TaskState, dst: TaskState) -> None:
    """Raise `InvalidTransition` unless `src -> dst` is in the table."""
    if not allowed(src, dst):
        raise InvalidTransition(f"task cannot go from {src} to {dst}")


def sources_for(dst: TaskState, among: frozenset[TaskState] | None = None) -> list[TaskState]:
    """The states from which `dst` may be reached, optionally narrowed to `among`, sorted.

    The repositories pass this list as the `state = ANY($2)` guard of a compare-and-set.
    Raises `InvalidTransition` when no source remains.
    """
    found = sorted(s for s, dsts in TRANSITIONS.items() if dst in dsts)
    if among is not None:
        found = [s for s in found if s in among]
    if not found:
        raise InvalidTransition(f"no allowed source state for {dst} among {among}")
    return found


def failure_state_for(state: TaskState) -> TaskState:
    """Where a task held by a worker in `state` goes when its worker, host or process is lost.

    A lost hook returns the task to the state it was recovered or restarted from.
    """
    stage_failures = {
        S.SETTING_UP: S.FAILED_TO_SETUP,
        S.ON_CPU: S.FAILED_ON_CLUSTER,
        S.QUEUED: S.FAILED_ON_CLUSTER,
        S.DATA_READY: S.FAILED_ON_CLUSTER,
        S.POST_PROCESSING: S.FAILED_ON_CLUSTER,
    }
    if state in stage_failures:
        return stage_failures[state]
    for action, (running, _ok, failed) in ACTIONS.items():
        if state in (action, running):
            return failed
    raise InvalidTransition(f"a task in {state} is not held by a worker")


JOB_TRANSITIONS: Final[Mapping[JobState, frozenset[JobState]]] = {
    # `activate` makes the job's tasks; a configuring job can also be given up.
    JobState.CONFIGURING: frozenset({JobState.ACTIVE, JobState.CANCELLED}),
    JobState.ACTIVE: frozenset(
        {JobState.SUSPENDED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUSPENDED: frozenset({JobState.ACTIVE, JobState.CANCELLED}),
    # A finished job becomes active again when inputs are appended or a task is recovered.
    JobState.COMPLETED: frozenset({JobState.ACTIVE}),
    JobState.FAILED: frozenset({JobState.ACTIVE}),
    JobState.CANCELLED: frozenset(),
}


def job_sources_for(dst: JobState) -> list[JobState]:
    """The job states from which `dst` may be reached, sorted (a compare-and-set guard)."""
    found = sorted(s for s, dsts in JOB_TRANSITIONS.items() if dst in dsts)
    if not found:
        raise InvalidTransition(f"no job state leads to {dst}")
    return found


def job_outcome(task_states: Mapping[TaskState, int]) -> JobState | None:
    """The final state of a job whose tasks are in `task_states` (counts), or None if unfinished.

    A job with no task is not finished.
    """
    total = sum(task_states.values())
    if total == 0 or any(n and s not in TERMINAL for s, n in task_states.items()):
        return None
    if task_states.get(S.COMPLETED, 0) == total:
        return JobState.COMPLETED
    return JobState.FAILED
