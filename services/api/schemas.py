"""HTTP request bodies and response views (design §9), separate from the wire messages.

Request models forbid unknown fields and name the field at fault in every error; checks that
depend on settings or on the database are done by `JobCreate.check_against` and `submission`.
Views are built from repository records by `from_…` constructors.
"""

import re
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from services.api import json_values
from services.api.errors import invalid
from shared.analysers import DEFAULT as DEFAULT_ANALYSER
from shared.attempts_repo import Attempt
from shared.ids import is_safe_id
from shared.jobs_repo import Job, NewJob
from shared.logs_repo import StoredLog
from shared.policy import Policy
from shared.pool_status import PoolStatus, job_waiting_on
from shared.states import FailureClass, JobState, TaskState
from shared.task_types.base import TaskType
from shared.tasks_repo import Task

MAX_NAME_CHARS: Final = 200
MAX_COMMAND_CHARS: Final = 65_536
MAX_INPUT_BYTES: Final = 65_536
MAX_OUTPUTS: Final = 1000
MAX_OUTPUT_CHARS: Final = 255
MAX_PARAMS: Final = 1000
MAX_PREREQUISITES: Final = 1000
#: Longest retention a job may ask for: ten years.
MAX_RETENTION_S: Final = 10 * 365 * 86400.0
#: Printable text: no control characters (names end up in terminals and log lines).
TEXT_PATTERN: Final = r"^[^\x00-\x1f\x7f]*$"
TYPE_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,62}$"
_OUTPUT_RE: Final = re.compile(rf"[^\x00-\x1f\x7f]{{1,{MAX_OUTPUT_CHARS}}}")

RequiredState = Literal["queued", "data_ready", "completed", "failed"]
Stage = Literal["setup", "post_processing"]


def _id_check(kind: str) -> AfterValidator:
    def check(value: str) -> str:
        if not is_safe_id(value):
            raise ValueError(f"{kind} id {value[:100]!r} is not a valid id")
        return value

    return AfterValidator(check)


def _text(what: str) -> AfterValidator:
    def check(value: str) -> str:
        problem = json_values.text_problem(value)
        if problem:
            raise ValueError(f"{what} {problem}")
        return value

    return AfterValidator(check)


def _check_output(name: str) -> str:
    bad = name in (".", "..") or "/" in name or json_values.text_problem(name)
    if bad or not _OUTPUT_RE.fullmatch(name):
        raise ValueError(
            f"output {name[:100]!r} must be a plain file name: no '/', not '.' or '..',"
            f" no control characters, 1 to {MAX_OUTPUT_CHARS} characters"
        )
    return name


def _check_input(value: Any) -> Any:
    json_values.check(value, "input")
    size = json_values.encoded_size(value)
    if size > MAX_INPUT_BYTES:
        raise ValueError(f"input is {size} bytes as JSON; the limit is {MAX_INPUT_BYTES}")
    return value


#: Highest `max_in_flight` / `release_per_tick` a submission or a throttle may set.
MAX_THROTTLE: Final = 100_000
ThrottleLimit = Annotated[int | None, Field(ge=1, le=MAX_THROTTLE)]

TaskId = Annotated[str, _id_check("task")]
JobId = Annotated[str, _id_check("job")]
OutputName = Annotated[str, AfterValidator(_check_output)]
InputValue = Annotated[Any, AfterValidator(_check_input)]
#: A non-empty list of inputs (the count limit is a setting: see `check_against`).
Inputs = Annotated[list[InputValue], Field(min_length=1)]
ParamName = Annotated[
    str, Field(min_length=1, max_length=200, pattern=TEXT_PATTERN), _text("parameter name")
]
Name = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=TEXT_PATTERN), _text("name")
]
Command = Annotated[str, Field(max_length=MAX_COMMAND_CHARS), _text("command")]
ParamValue = Annotated[Any, AfterValidator(lambda v: json_values.check(v, "parameter"))]


class Prerequisites(BaseModel):
    """Tasks every task of the job waits for, per stage, with the state each must reach (§4)."""

    model_config = ConfigDict(extra="forbid")

    setup: dict[TaskId, RequiredState] = Field(default_factory=dict, max_length=MAX_PREREQUISITES)
    post_processing: dict[TaskId, RequiredState] = Field(
        default_factory=dict, max_length=MAX_PREREQUISITES
    )

    def referenced(self) -> set[str]:
        """Every task id named in either stage."""
        return set(self.setup) | set(self.post_processing)


class JobCreate(BaseModel):
    """The body of `POST /jobs`."""

    model_config = ConfigDict(extra="forbid")

    name: Name = "job"
    type: str = Field(default="shell", pattern=TYPE_PATTERN)
    command: Command | None = Field(default=None, validate_default=True)
    inputs: Inputs | None = Field(
        default=None,
        description="One task per input. Left out (or null): one empty input, or none with"
        " inputs_from.",
    )
    outputs: list[OutputName] = Field(default_factory=list, max_length=MAX_OUTPUTS)
    params: dict[ParamName, ParamValue] = Field(default_factory=dict, max_length=MAX_PARAMS)
    policy: Policy = Field(default_factory=Policy)
    prerequisites: Prerequisites = Field(default_factory=Prerequisites)
    inputs_from: JobId | None = None
    configuring: bool = Field(
        default=False,
        description="Create the job configuring: its inputs are held and only test runs"
        " (POST /jobs/{id}/tests) run until the action `activate`; until then command, inputs,"
        " outputs, params and policy can be edited (PATCH /jobs/{id}).",
    )
    max_in_flight: ThrottleLimit = Field(
        default=None,
        description="Most tasks of the job running at once, from its first release on (left"
        " out: 1000). Changed later with the action `throttle`.",
    )
    release_per_tick: ThrottleLimit = Field(
        default=None,
        description="Most new tasks released per scheduler tick (left out: 1000).",
    )
    retention_s: float | None = Field(
        default=None,
        ge=1,
        le=MAX_RETENTION_S,
        description="Purge the job's logs, kept outputs and work dirs this many seconds after"
        " it ends (at least the api's VIGIL_MIN_RETENTION_S, 60 by default; at most 10 years)."
        " Left out: kept until purged by hand.",
    )

    @field_validator("command")
    @classmethod
    def _check_command(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("type") == "shell" and (value is None or not value.strip()):
            raise ValueError("command is required for shell jobs and must not be blank")
        return value

    @field_validator("inputs_from")
    @classmethod
    def _check_one_source(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("inputs") is not None:
            raise ValueError("give either inputs or inputs_from, not both")
        return value

    @field_validator("outputs")
    @classmethod
    def _check_unique_outputs(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in value:
            if name in seen:
                raise ValueError(f"output {name!r} is listed twice")
            seen.add(name)
        return value

    def check_against(
        self,
        task_types: Mapping[str, TaskType],
        max_inputs: int,
        analysers: Collection[str] = (DEFAULT_ANALYSER,),
    ) -> None:
        """Raise a 422 `RequestValidationError` naming every problem found.

        Problems: an unknown type, params that do not fit the type's `params_model`, more than
        `max_inputs` inputs, an analyser that is not installed.
        """
        errors: list[Any] = []
        if self.policy.analyser not in analysers:
            msg = (
                f"unknown analyser {self.policy.analyser!r};"
                f" installed: {', '.join(sorted(analysers))}"
            )
            errors.extend(invalid(("body", "policy", "analyser"), msg).errors())
        task_type = task_types.get(self.type)
        if task_type is None:
            known = ", ".join(sorted(task_types)) or "none installed"
            msg = f"unknown task type {self.type!r}; known types: {known}"
            errors.extend(invalid(("body", "type"), msg).errors())
        elif task_type.params_model is not None:
            errors.extend(_params_errors(task_type.params_model, self.params, self.type))
        errors.extend(count_errors(self.inputs or [], max_inputs))
        if errors:
            raise RequestValidationError(errors)

    def task_inputs(self) -> list[Any]:
        """The inputs of the tasks made at submission.

        None for a chained job (its tasks come from the upstream job), one empty input when
        `inputs` was left out.
        """
        if self.inputs_from is not None:
            return []
        return list(self.inputs) if self.inputs is not None else [""]

    def to_new_job(self, idempotency_key: str | None) -> NewJob:
        """The repository's form of this submission."""
        return NewJob(
            name=self.name,
            type=self.type,
            command=self.command or "",
            inputs=self.task_inputs(),
            outputs=list(self.outputs),
            params=dict(self.params),
            policy=self.policy.model_dump(mode="json"),
            prerequisites=self.prerequisites.model_dump(exclude_unset=True),
            inputs_from=self.inputs_from,
            idempotency_key=idempotency_key,
            configuring=self.configuring,
            max_in_flight=self.max_in_flight,
            release_per_tick=self.release_per_tick,
        )


def count_errors(inputs: list[Any], max_inputs: int) -> list[Any]:
    """The 422 error (as a list of one, or empty) for more than `max_inputs` inputs."""
    if len(inputs) <= max_inputs:
        return []
    msg = f"{len(inputs)} inputs given; at most {max_inputs} are accepted"
    return list(invalid(("body", "inputs"), msg).errors())


def _params_errors(model: type[BaseModel], params: dict[str, Any], type_name: str) -> list[Any]:
    try:
        model.model_validate(params)
    except ValidationError as exc:
        return [
            {**e, "loc": ("body", "params", *e["loc"]), "msg": f"{e['msg']} (for {type_name})"}
            for e in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
    return []


class JobPublic(BaseModel):
    """A job as clients see it, with its task counts per state."""

    id: str
    owner_id: str
    name: str
    type: str
    state: JobState
    counts: dict[str, int]
    policy: dict[str, Any]
    created_at: datetime
    finished_at: datetime | None
    command: str
    outputs: list[str]
    params: dict[str, Any]
    prerequisites: dict[str, Any]
    inputs_from: str | None
    max_in_flight: int
    release_per_tick: int
    test_counts: dict[str, int] = Field(
        default_factory=dict, description="Test tasks per state (not counted in `counts`)."
    )
    held_inputs: int | None = Field(
        default=None, description="Inputs held until activation (configuring jobs only)."
    )
    activated_at: datetime | None = None
    retention_s: float | None = Field(
        default=None, description="Data purged this long after the job ends (null: kept)."
    )
    purged_at: datetime | None = Field(
        default=None, description="When its logs, kept outputs and work dirs were purged."
    )
    purged_by: str | None = None
    purge_reason: str | None = None
    waiting_on: str | None = Field(
        default=None,
        description="Why its new tasks do not start now (every host of the pool quarantined,"
        " no live worker, the job probing after failures); null when nothing holds them."
        " Given by `GET /jobs` and `GET /jobs/{id}`.",
    )

    @classmethod
    def from_job(cls, job: Job, pool: PoolStatus | None = None) -> "JobPublic":
        """The job as clients see it; with the pool's status, why it waits (if it does)."""
        held = len(job.inputs) if job.inputs is not None else None
        names = set(cls.model_fields) - {"held_inputs", "waiting_on"}
        waiting = None
        if pool is not None and job.state in (JobState.ACTIVE, JobState.CONFIGURING):
            counts = job.counts if job.state is JobState.ACTIVE else job.test_counts
            waiting = job_waiting_on(counts.get("new", 0), job.probing_since, pool)
        return cls(
            **{name: getattr(job, name) for name in names}, held_inputs=held, waiting_on=waiting
        )


class JobsPage(BaseModel):
    """One page of `GET /jobs`; pass `next_cursor` back as `cursor` for the next (null: done)."""

    items: list[JobPublic]
    next_cursor: str | None


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
    resubmitted_from: str | None
    superseded_by: str | None
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

    @classmethod
    def from_task(
        cls, task: Task, prerequisites: list[PrerequisitePublic], *, detail: bool
    ) -> "TaskPublic":
        """The view of `task`; `error_detail` (a worker's traceback, with the servers' paths)
        only with `detail` (operators: issue 17), the brief always."""
        fields = {n: getattr(task, n) for n in cls.model_fields if n != "prerequisites"}
        if not detail:
            fields["error_detail"] = None
        return cls(**fields, prerequisites=prerequisites)

    @classmethod
    def from_found(
        cls, task: Task, found: Mapping[str, list[dict[str, Any]]], *, detail: bool
    ) -> "TaskPublic":
        """The view of `task`, its prerequisites picked from `queries.prerequisites_of` rows."""
        rows = found.get(task.id, [])
        prerequisites = [PrerequisitePublic.model_validate(p) for p in rows]
        return cls.from_task(task, prerequisites, detail=detail)


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
    """`GET /tasks/{id}`: the task and every attempt of it, oldest first."""

    attempts: list[AttemptPublic]

    @classmethod
    def from_parts(
        cls,
        task: Task,
        prerequisites: list[PrerequisitePublic],
        attempts: list[Attempt],
        *,
        detail: bool,
    ) -> "TaskDetail":
        view = TaskPublic.from_task(task, prerequisites, detail=detail)
        shown = [AttemptPublic.from_attempt(a, detail=detail) for a in attempts]
        return cls(**dict(view), attempts=shown)


class JobErrorPublic(BaseModel):
    """An error-severity log record that failed a task of the job, with the lines before it;
    or a work message of the job that the broker gave up on (severity `dead_letter`)."""

    task_id: str
    ts: datetime
    severity: str
    brief: str
    detail: str | None


class LogPublic(BaseModel):
    """One output line of a task's command."""

    seq: int
    ts: datetime
    task_id: str
    run_number: int
    attempt: int
    severity: str
    stream: str
    line: str

    @classmethod
    def from_stored(cls, log: StoredLog) -> "LogPublic":
        return cls(**{name: getattr(log, name) for name in cls.model_fields})


class LogsPage(BaseModel):
    """Lines in order; pass `next_after` back as `after` to continue (null: nothing new)."""

    items: list[LogPublic]
    next_after: int | None


class EventPublic(BaseModel):
    """One event of the history: its position, routing key and body (with `seq`)."""

    seq: int
    routing_key: str
    body: dict[str, Any]


class EventsPage(BaseModel):
    """One page of a job's events; pass `next` back (as `after` oldest first, `before` newest
    first) for the next page (null: this one was the last)."""

    items: list[EventPublic]
    next: int | None


class Health(BaseModel):
    """`ok`; `degraded` when the api answers but something it relies on does not (the
    reasons say what); `unavailable` when the database does not answer."""

    status: Literal["ok", "degraded", "unavailable"]
    reasons: list[str] = Field(default_factory=list)
