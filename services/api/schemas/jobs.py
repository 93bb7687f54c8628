"""Bodies and views of `/jobs`: a submission, an edit, actions, appended inputs, test runs,
the job as shown, its errors and its log lines.

Request models forbid unknown fields and name the field at fault in every error; checks that
depend on settings or on the database are done by `check_against` / `validated` and
`services.api.submission`. Views are built from repository records by `from_…` constructors.
"""

import base64
import binascii
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from services.api.errors import invalid
from services.api.schemas.common import (
    MAX_OUTPUTS,
    MAX_PARAMS,
    MAX_PREREQUISITES,
    MAX_RETENTION_S,
    TYPE_PATTERN,
    Command,
    Inputs,
    InputValue,
    JobId,
    Name,
    OutputName,
    ParamName,
    ParamValue,
    RequiredState,
    TaskId,
    ThrottleLimit,
)
from shared.domain import bundle
from shared.domain.actions import JobAction
from shared.domain.analysers import DEFAULT as DEFAULT_ANALYSER
from shared.domain.policy import Policy
from shared.domain.sizes import human_size
from shared.domain.states import JobState
from shared.operations.configuring import TrialInput
from shared.operations.pool_status import PoolStatus, job_waiting_on
from shared.store.jobs_repo import Job, NewJob
from shared.store.logs_repo import StoredLog
from shared.task_types.base import TaskType


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


class FileIn(BaseModel):
    """One file of a job's bundle, as submitted."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(description="The file's bytes, base64-encoded.")
    executable: bool = Field(default=False, description="Placed with mode 0555, not 0444.")


def decoded_files(files: Mapping[str, FileIn]) -> dict[str, tuple[bytes, bool]]:
    """The bundle's files as bytes, or a `ValueError` naming the file at fault."""
    found: dict[str, tuple[bytes, bool]] = {}
    total = 0
    for path, file in files.items():
        problem = bundle.path_problem(path)
        if problem is not None:
            raise ValueError(problem)
        try:
            content = base64.b64decode(file.content, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"the content of {path!r} is not base64 ({exc})") from None
        total += len(content)
        if total > bundle.MAX_BYTES:
            raise ValueError(
                f"the files are over {human_size(bundle.MAX_BYTES)} in all: put large data"
                " where the hosts can read it (docs/security.md, 'A job's files')"
            )
        found[path] = (content, file.executable)
    return found


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
    files: dict[str, FileIn] = Field(
        default_factory=dict,
        max_length=bundle.MAX_FILES,
        description="The job's own files (scripts, configs, small data), by relative path:"
        " placed read-only in every task's work dir, on any host (at most"
        f" {bundle.MAX_FILES} files, {bundle.MAX_BYTES // (1024 * 1024)} MiB in all).",
    )
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

    @field_validator("files")
    @classmethod
    def _check_files(cls, value: dict[str, FileIn], info: ValidationInfo) -> dict[str, FileIn]:
        decoded_files(value)
        problems = bundle.conflicts(list(value), info.data.get("outputs") or [])
        if problems:
            raise ValueError("; ".join(problems))
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
            files=decoded_files(self.files),
        )


def count_errors(inputs: list[Any], max_inputs: int) -> list[Any]:
    """The 422 error (as a list of one, or empty) for more than `max_inputs` inputs: it says
    how to give the rest (they are added to the job, `max_inputs` at most a request)."""
    if len(inputs) <= max_inputs:
        return []
    msg = (
        f"{len(inputs)} inputs given; at most {max_inputs} are accepted in one request:"
        f" give the first {max_inputs}, then add the rest to the job, up to {max_inputs} a"
        " request, with POST /jobs/{id}/inputs (`vigil append JOB FILE`)"
    )
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
    counts: dict[str, int] = Field(
        description="Tasks per state: the last task of each input's lineage (test tasks, and"
        " tasks superseded by their resubmitted clone, left out)."
    )
    superseded: int = Field(
        default=0,
        description="Tasks superseded by their resubmitted clone (test tasks left out): history,"
        " not in `counts`; each names its clone in `superseded_by` (GET /jobs/{id}/tasks).",
    )
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
    files: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The job's own files: path, size, sha256, executable (their bytes are"
        " deleted by a purge).",
    )
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


class JobSubmitted(JobPublic):
    """The answer to `POST /jobs`: the job, and what the submitter should know before it runs."""

    warnings: list[str] = Field(
        default_factory=list,
        description="Problems found without refusing the job: a `shell` command that `bash -n`"
        " cannot parse (its tasks would fail with exit code 2), with what bash said.",
    )


class JobsPage(BaseModel):
    """One page of `GET /jobs`; pass `next_cursor` back as `cursor` for the next (null: done)."""

    items: list[JobPublic]
    next_cursor: str | None


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


class InputsAppend(BaseModel):
    """The body of `POST /jobs/{id}/inputs`: each input is checked as in `POST /jobs`."""

    model_config = ConfigDict(extra="forbid")

    inputs: Inputs

    def check_against(self, max_inputs: int) -> None:
        """Raise a 422 `RequestValidationError` when more than `max_inputs` inputs are given."""
        errors = count_errors(self.inputs, max_inputs)
        if errors:
            raise RequestValidationError(errors)


class JobActionRequest(BaseModel):
    """The body of `POST /jobs/{id}/actions`; the two limits go with `throttle` only."""

    model_config = ConfigDict(extra="forbid")

    action: JobAction
    max_in_flight: ThrottleLimit = Field(default=None, description="Most tasks running at once.")
    release_per_tick: ThrottleLimit = Field(
        default=None, description="Most new tasks released per scheduler tick."
    )

    @field_validator("max_in_flight", "release_per_tick")
    @classmethod
    def _only_to_throttle(cls, value: int | None, info: ValidationInfo) -> int | None:
        # An invalid action already has its own error: do not add a second one here.
        action = info.data.get("action", JobAction.THROTTLE)
        if value is not None and action is not JobAction.THROTTLE:
            raise ValueError(f"{info.field_name} is only accepted with the action throttle")
        return value

    @model_validator(mode="after")
    def _throttle_needs_a_limit(self) -> "JobActionRequest":
        limits = (self.max_in_flight, self.release_per_tick)
        if self.action is JobAction.THROTTLE and limits == (None, None):
            raise ValueError("throttle needs max_in_flight and/or release_per_tick")
        return self


class InputsAdded(BaseModel):
    """The job after an append, and the ids of its new tasks in index order."""

    job: JobPublic
    task_ids: list[str]


class TestRequest(BaseModel):
    """The body of `POST /jobs/{id}/tests`: which input the test task runs on."""

    model_config = ConfigDict(extra="forbid")

    input_index: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="A held input by position (a chained job: the upstream task at that"
        " position); 0 when neither this nor `input` is given.",
    )
    input: InputValue = Field(default=None, description="An explicit test input.")

    @model_validator(mode="after")
    def _one_source(self) -> "TestRequest":
        if self.input_index is not None and "input" in self.model_fields_set:
            raise ValueError("give either input_index or input, not both")
        return self

    def what(self) -> TrialInput:
        """The shared form of this request."""
        if "input" in self.model_fields_set:
            return TrialInput(value=self.input, explicit=True)
        return TrialInput(index=self.input_index or 0)


class JobEdit(BaseModel):
    """New values for some fields of a job; `policy` names only the fields that change."""

    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    command: Command | None = None
    inputs: Inputs | None = Field(default=None, description="Replaces the held inputs.")
    outputs: list[OutputName] | None = Field(default=None, max_length=MAX_OUTPUTS)
    params: dict[str, Any] | None = None
    policy: dict[str, Any] | None = Field(
        default=None, description="Policy fields to change; the others keep their value."
    )
    max_in_flight: ThrottleLimit = None
    release_per_tick: ThrottleLimit = None
    retention_s: float | None = Field(
        default=None,
        ge=1,
        le=MAX_RETENTION_S,
        description="Purge the job's data this long after it ends; null: keep it until purged"
        " by hand.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_files(cls, data: Any) -> Any:
        if isinstance(data, dict) and "files" in data:
            raise ValueError(
                "a job's files cannot be edited (tasks may have them already): submit a new"
                " job with them (--configuring, to try it first)"
            )
        return data

    @model_validator(mode="after")
    def _something(self) -> "JobEdit":
        if not self.model_fields_set:
            raise ValueError("nothing to change: name at least one field")
        nulls = sorted(
            k for k in self.model_fields_set - {"retention_s"} if getattr(self, k) is None
        )
        if nulls:
            raise ValueError(f"{', '.join(nulls)} cannot be null (leave a field out to keep it)")
        return self

    def given(self) -> dict[str, Any]:
        """The fields the edit names, with their values."""
        return self.model_dump(mode="json", include=self.model_fields_set)

    def validated(
        self,
        job: Job,
        task_types: Mapping[str, TaskType],
        max_inputs: int,
        analysers: Collection[str],
    ) -> dict[str, Any]:
        """The new values, normalised; a 422 naming the field when the edited job would not
        be a valid submission."""
        given = self.given()
        policy = {**job.policy, **given.get("policy", {})}
        candidate = {
            "name": given.get("name", job.name),
            "type": job.type,
            "command": given.get("command", job.command),
            "outputs": given.get("outputs", job.outputs),
            "params": given.get("params", job.params),
            "policy": policy,
        }
        if "inputs" in given:
            candidate["inputs"] = given["inputs"]
        try:
            checked = JobCreate.model_validate(candidate)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in errors]
            ) from exc
        checked.check_against(task_types, max_inputs, analysers)
        if "policy" in given:
            given["policy"] = checked.policy.model_dump(mode="json")
        if "params" in given:
            given["params"] = dict(checked.params)
        return given
