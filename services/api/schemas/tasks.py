"""Views and bodies of `/tasks`: a task, its prerequisites and attempts, its actions."""

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from services.api.queries import Timing
from services.api.schemas.common import RequiredState, Stage, WaitingReasonPublic
from shared.domain.actions import TaskAction
from shared.domain.states import FAILED, FailureClass, TaskState
from shared.domain.waiting import Why
from shared.store.attempts_repo import Attempt
from shared.store.tasks_repo import Task


class PrerequisitePublic(BaseModel):
    """The task waits at `stage` for task `task_id` to reach `required`."""

    stage: Stage
    task_id: str
    required: RequiredState


class TaskPublic(BaseModel):
    """A task as clients see it (design §9)."""

    id: str
    job_id: str
    index: int
    input: Any
    state: TaskState
    run_number: int
    attempt: int
    failure_class: FailureClass | None
    exit_code: int | None
    signal: int | None
    error_brief: str | None
    error_detail: str | None
    host: str | None
    worker: str | None
    pid: int | None
    progress: int | None
    resubmitted_from: str | None = Field(description="The task this one is a clone of.")
    superseded_by: str | None = Field(
        description="The clone that carries its input on (same index): set, the task is"
        " history, counted in its job's `superseded`, not in `counts`, and refused every"
        " action but cancel."
    )
    decision: str | None = Field(
        default=None,
        description="While the task is failed: what the triage decided after its last failure"
        " (recovered, resubmitted, abandoned, or fencing while the old process may live);"
        " null while undecided.",
    )
    decision_reason: str | None = Field(default=None, description="Why, as the triage said it.")
    prerequisites: list[PrerequisitePublic]
    workdir: str | None
    created_at: datetime
    updated_at: datetime
    infra_retries: int = Field(description="Resubmissions used by this task's lineage.")
    app_retries: int = Field(description="Recoveries in place used.")
    decided: bool = Field(description="False while a failure awaits the scheduler's triage.")
    not_before: datetime | None = Field(description="Not released before (resubmission backoff).")
    test: bool = Field(
        default=False, description="A test run of a configuring job (negative index)."
    )
    started_at: datetime | None = Field(
        default=None, description="When its first attempt began (null: it never started)."
    )
    stage_started_at: datetime | None = Field(
        default=None,
        description="In flight, while a stage (or a recovery's hook) runs: when it began.",
    )
    ended_at: datetime | None = Field(
        default=None, description="At rest (ended, failed, new again): when its last attempt ended."
    )
    elapsed_s: float | None = Field(
        default=None,
        description="Seconds, as of this answer: in flight, the time in the stage that runs"
        " (between stages, since `started_at`); at rest, from `started_at` to `ended_at`;"
        " null if it never started.",
    )

    @classmethod
    def from_task(
        cls,
        task: Task,
        prerequisites: list[PrerequisitePublic],
        *,
        detail: bool,
        decision: tuple[str, str | None] | None = None,
        timing: Timing | None = None,
    ) -> "TaskPublic":
        """The view of `task`; `error_detail` (a worker's traceback, with the servers' paths)
        only with `detail` (operators), the brief always; `decision` the triage's
        (verdict, reason) on its failure (`queries.decisions_of`); `timing` when it ran
        (`queries.timings_of`)."""
        own = set(cls.model_fields) - {"prerequisites", "decision", "decision_reason", *_TIMING}
        fields = {n: getattr(task, n) for n in own}
        if not detail:
            fields["error_detail"] = None
        if timing is not None:
            fields |= timing.fields()
        verdict, reason = decision or (None, None)
        return cls(**fields, prerequisites=prerequisites, decision=verdict, decision_reason=reason)

    @classmethod
    def from_found(
        cls,
        task: Task,
        found: Mapping[str, list[dict[str, Any]]],
        *,
        detail: bool,
        decision: tuple[str, str | None] | None = None,
        timing: Timing | None = None,
    ) -> "TaskPublic":
        """The view of `task`, its prerequisites picked from `queries.prerequisites_of` rows."""
        rows = found.get(task.id, [])
        prerequisites = [PrerequisitePublic.model_validate(p) for p in rows]
        return cls.from_task(task, prerequisites, detail=detail, decision=decision, timing=timing)


#: The view's fields read from the attempts (`queries.Timing`), not from the task's row.
_TIMING: Final = frozenset(field.name for field in dataclasses.fields(Timing))


class AttemptPublic(BaseModel):
    """One row of the attempts audit: one execution of one stage."""

    attempt: int
    run_number: int
    stage: str
    host: str | None
    worker: str | None
    pid: int | None
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    exit_code: int | None
    signal: int | None
    failure_class: str | None
    error_brief: str | None
    error_detail: str | None
    log_path: str | None
    status: dict[str, Any] | None = Field(description="The status file the attempt left.")
    decision: str | None = Field(
        description="What the triage decided after this attempt failed: recovered,"
        " resubmitted, abandoned (or fencing while it waits for the old process to die)."
    )
    decision_reason: str | None
    decided_at: datetime | None
    late_report: dict[str, Any] | None = Field(
        description="A report from this attempt that arrived after it was fenced off."
    )
    reaped_at: datetime | None = Field(description="When its process was known to be gone.")

    @classmethod
    def from_attempt(cls, attempt: Attempt, *, detail: bool) -> "AttemptPublic":
        fields = {name: getattr(attempt, name) for name in cls.model_fields}
        if not detail:
            fields["error_detail"] = None
        return cls(**fields)


class TaskDetail(TaskPublic):
    """`GET /tasks/{id}`: the task and every attempt of it, oldest first, and why it waits."""

    attempts: list[AttemptPublic]
    waiting_reason: WaitingReasonPublic | None = Field(
        default=None,
        description="Why it waits: new and not yet placed (an emergency stop, its"
        " job suspended or configuring, a prerequisite, its backoff, then the scheduler's"
        " reason for its job, or `pending` until the next round), placed and `starting`,"
        " `held` by an operator, or `queued_on_host`; null when it is not waiting.",
    )

    @classmethod
    def from_parts(
        cls,
        task: Task,
        prerequisites: list[PrerequisitePublic],
        attempts: list[Attempt],
        *,
        detail: bool,
        timing: Timing | None = None,
        waiting: Why | None = None,
    ) -> "TaskDetail":
        last = attempts[-1] if attempts else None
        decision = None
        if last is not None and last.decision is not None and task.state in FAILED:
            decision = (last.decision, last.decision_reason)
        view = TaskPublic.from_task(
            task, prerequisites, detail=detail, decision=decision, timing=timing
        )
        shown = [AttemptPublic.from_attempt(a, detail=detail) for a in attempts]
        reason = WaitingReasonPublic.of(waiting) if waiting is not None else None
        return cls(**dict(view), attempts=shown, waiting_reason=reason)


class TaskActionRequest(BaseModel):
    """The body of `POST /tasks/{id}/actions` (design §2: recovery and restart)."""

    model_config = ConfigDict(extra="forbid")

    action: TaskAction


class TaskActionPublic(BaseModel):
    """What a task action did: the task as it now is, and the task `duplicate` made (else null)."""

    task: TaskPublic
    created: TaskPublic | None
