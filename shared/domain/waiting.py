"""Why a task or a job waits, as `GET /tasks/{id}` and `GET /jobs/{id}` say it: one
pure decision from facts the caller gathers, in one place.

The scheduler's planning round writes one reason per waiting job (`job_waits`, the planner's
`shared/domain/scheduling/reasons.py`); what only a task or its job can say comes first, in
this order: an emergency stop in force, the job suspended, the job configuring (only test
tasks run), an unmet setup prerequisite, a resubmission's backoff; then the job's row; else
the task waits for the scheduler's next round. A task that is not waiting to be placed has its
own answer (placed and starting, held by an operator, queued on its host) or none.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from shared.domain.prerequisites import Required, is_met
from shared.domain.scheduling import reasons
from shared.domain.scheduling.reasons import WaitingReason
from shared.domain.states import FAILED, JobState, TaskState


class TaskWait(StrEnum):
    """The reasons only a task (or its job's state) gives, beside the planner's
    `WaitingReason` values: together, what `waiting_reason.reason` may say."""

    CONFIGURING = "configuring"  # its job is configuring and it is not a test task
    BACKOFF = "backoff"  # a resubmitted clone waits out its backoff (`not_before`)
    PENDING = "pending"  # no reason recorded yet: the scheduler's next round decides
    STARTING = "starting"  # claimed (placed): its setup is about to start
    HELD = "held"  # on hold: an operator holds it
    QUEUED_ON_HOST = "queued_on_host"  # set up on its host, waiting for its turn there


#: Every reason a waiting task or job can be given, for documentation and tests.
ALL_REASONS: tuple[str, ...] = tuple(r.value for r in WaitingReason) + tuple(
    r.value for r in TaskWait
)


@dataclass(frozen=True)
class Why:
    """A reason with its message and its numbers (JSON)."""

    reason: str
    message: str
    detail: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, wait: reasons.Wait) -> "Why":
        """One of the planner's reasons."""
        return cls(wait.reason.value, wait.message(), reasons.detail(wait))


@dataclass(frozen=True)
class StoredWait:
    """A job's row of `job_waits`: the last planning round's reason for its waiting tasks."""

    reason: str
    message: str
    detail: Mapping[str, object]
    at: datetime

    def why(self) -> Why:
        return Why(self.reason, self.message, dict(self.detail))


@dataclass(frozen=True)
class Prerequisite:
    """A setup prerequisite of the task: task `task_id` must reach `required`; it is in
    `state` (`decided`: the triage decided its failure, for `failed`)."""

    task_id: str
    required: str
    state: TaskState
    decided: bool = True

    @property
    def met(self) -> bool:
        """As `shared.domain.prerequisites.unmet_sql` says it (a failed task meets `failed`
        once the triage decided it stays failed)."""
        required = Required(self.required)
        if required is Required.FAILED:
            return self.state in FAILED and self.decided
        return is_met(required, self.state)


@dataclass(frozen=True)
class TaskFacts:
    """What the decision reads of the task itself."""

    state: TaskState
    claimed: bool
    host: str | None = None
    test: bool = False
    not_before: datetime | None = None


CONFIGURING_MESSAGE = "the job is configuring: only test tasks run until it is activated"
PENDING_MESSAGE = "waiting for the scheduler's next round"


def _prerequisite_why(unmet: Sequence[Prerequisite]) -> Why:
    first = unmet[0]
    more = f"; and {len(unmet) - 1} more" if len(unmet) > 1 else ""
    message = (
        f"a prerequisite is not met yet: task {first.task_id} must reach {first.required}"
        f" (it is {first.state.value}){more}"
    )
    detail = {
        "task_id": first.task_id,
        "required": first.required,
        "state": first.state.value,
        "unmet": len(unmet),
    }
    return Why(WaitingReason.PREREQUISITES.value, message, detail)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def task_waiting(
    task: TaskFacts,
    *,
    job_state: JobState,
    stop_in_force: bool,
    prerequisites: Sequence[Prerequisite],
    job_wait: StoredWait | None,
    now: datetime,
) -> Why | None:
    """Why `task` waits, or None when it does not (it runs, rests after its command, or has
    ended). `prerequisites` are its setup prerequisites (met or not); `job_wait` its job's
    `job_waits` row, if any; `now` the time to compare its `not_before` with."""
    if task.state is not TaskState.NEW or task.claimed:
        return _placed_or_held(task)
    if stop_in_force:
        return Why.of(reasons.EmergencyStop())
    if job_state is JobState.SUSPENDED:
        return Why.of(reasons.Suspended())
    if job_state is JobState.CONFIGURING and not task.test:
        return Why(TaskWait.CONFIGURING.value, CONFIGURING_MESSAGE)
    unmet = [p for p in prerequisites if not p.met]
    if unmet:
        return _prerequisite_why(unmet)
    if task.not_before is not None and task.not_before > now:
        return Why(
            TaskWait.BACKOFF.value,
            f"resubmitted: waits until {_when(task.not_before)} (its backoff)",
            {"not_before": task.not_before.isoformat()},
        )
    if job_wait is not None:
        return job_wait.why()
    return Why(TaskWait.PENDING.value, PENDING_MESSAGE)


def _placed_or_held(task: TaskFacts) -> Why | None:
    """Why a task that is not new and unplaced waits, from its own state alone."""
    if task.state is TaskState.NEW:  # claimed: placed
        message = (
            f"placed on host {task.host}, starting"
            if task.host
            else "released to the pool, starting when a worker takes it"
        )
        return Why(TaskWait.STARTING.value, message, {"host": task.host})
    if task.state is TaskState.ON_HOLD:
        return Why(
            TaskWait.HELD.value,
            "held (the action hold): it starts only once released (the action release)",
        )
    if task.state is TaskState.QUEUED:
        return Why(
            TaskWait.QUEUED_ON_HOST.value,
            f"set up on host {task.host}, waiting for its turn there",
            {"host": task.host},
        )
    return None


@dataclass(frozen=True)
class JobWaiting:
    """Why a job's tasks wait to be placed, and how many do."""

    why: Why
    tasks: int


def job_waiting(
    *,
    job_state: JobState,
    stop_in_force: bool,
    waiting_tasks: int,
    job_wait: StoredWait | None,
    has_prerequisites: bool = False,
) -> JobWaiting | None:
    """Why the job's `waiting_tasks` (new and not yet placed) wait, or None when none does.
    `has_prerequisites`: its tasks have setup prerequisites (given, or chained), which the
    planner's row does not cover: without a row, the answer says so."""
    if waiting_tasks <= 0:
        return None
    if stop_in_force:
        why = Why.of(reasons.EmergencyStop())
    elif job_state is JobState.SUSPENDED:
        why = Why.of(reasons.Suspended())
    elif job_wait is not None:
        why = job_wait.why()
    elif has_prerequisites:
        why = Why(
            TaskWait.PENDING.value,
            "waiting for their prerequisites or the scheduler's next round"
            " (each task's waiting_reason says which)",
        )
    else:
        why = Why(TaskWait.PENDING.value, PENDING_MESSAGE)
    return JobWaiting(why, waiting_tasks)
