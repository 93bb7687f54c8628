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
from typing import Annotated, Any, Final

from fastapi.exceptions import RequestValidationError
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
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
    WaitingReasonPublic,
)
from shared.domain import bundle, object_refs
from shared.domain.actions import JobAction
from shared.domain.analysers import DEFAULT as DEFAULT_ANALYSER
from shared.domain.policy import Policy
from shared.domain.scheduling.model import DEFAULT_REQUEST
from shared.domain.scheduling.resources import Resources
from shared.domain.sizes import human_size
from shared.domain.states import JobState
from shared.domain.waiting import JobWaiting
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


class FileRef(BaseModel):
    """One file of a job's files named by reference: an object of the store, staged into each
    task's work dir through its host's cache and checked against its sha256."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=object_refs.MAX_URL,
        description="The object: the store's URL (VIGIL_STORE_URL), '/', and its key.",
    )
    sha256: str = Field(description="The sha256 its bytes must have (64 lowercase hex digits).")
    executable: bool = Field(default=False, description="Placed with mode 0555, not 0444.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        problem = object_refs.url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("sha256")
    @classmethod
    def _check_sha256(cls, value: str) -> str:
        problem = object_refs.sha256_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def _file_form(value: Any) -> str:
    return "url" if isinstance(value, dict) and "url" in value else "content"


#: A job's file: its bytes (`content`), or an object of the store (`url` and `sha256`).
JobFile = Annotated[
    Annotated[FileIn, Tag("content")] | Annotated[FileRef, Tag("url")],
    Discriminator(_file_form),
]


def decoded_files(files: Mapping[str, FileIn | FileRef]) -> dict[str, tuple[bytes, bool]]:
    """The bundle's files given by their bytes, as bytes, or a `ValueError` naming the file at
    fault (those given by reference are `referenced_files`)."""
    found: dict[str, tuple[bytes, bool]] = {}
    total = 0
    for path, file in files.items():
        problem = bundle.path_problem(path)
        if problem is not None:
            raise ValueError(problem)
        if isinstance(file, FileRef):
            continue
        try:
            content = base64.b64decode(file.content, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"the content of {path!r} is not base64 ({exc})") from None
        total += len(content)
        if total > bundle.MAX_BYTES:
            raise ValueError(
                f"the files are over {human_size(bundle.MAX_BYTES)} in all: put large data"
                " where the hosts can read it (docs/explanation/security.md, 'A job's files')"
            )
        found[path] = (content, file.executable)
    return found


def referenced_files(files: Mapping[str, FileIn | FileRef]) -> list[object_refs.ObjectRef]:
    """The bundle's files given by reference, by path."""
    return [
        object_refs.ObjectRef(path, file.url, file.sha256, file.executable)
        for path, file in sorted(files.items())
        if isinstance(file, FileRef)
    ]


#: Most CPUs, GPUs and MiB one task may ask for: far above any host, below what
#: the columns hold.
MAX_CPUS: Final = 1024
MAX_GPUS: Final = 64
MAX_MEMORY_MB: Final = 2**31 - 1
#: The priorities an operator may set, -this to this; a user's are within
#: `VIGIL_PRIORITY_USER_RANGE` (`check_priority`).
PRIORITY_LIMIT: Final = 1_000_000


class ResourcesIn(BaseModel):
    """What each task of the job asks for: placed only on a host with that much
    free, and charged to its owner's fair share by it."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(
        default=DEFAULT_REQUEST.millicpus / 1000,
        strict=True,
        gt=0,
        le=MAX_CPUS,
        description=f"CPUs, more than 0, at most {MAX_CPUS}, to the thousandth (0.5, 2, 0.125).",
    )
    memory_mb: int = Field(
        default=DEFAULT_REQUEST.memory_mb,
        strict=True,
        ge=0,
        le=MAX_MEMORY_MB,
        description="Memory in MiB (0: none asked).",
    )
    gpus: int = Field(
        default=DEFAULT_REQUEST.gpus,
        strict=True,
        ge=0,
        le=MAX_GPUS,
        description=f"Whole GPUs, each its own (at most {MAX_GPUS}).",
    )

    @field_validator("cpus")
    @classmethod
    def _thousandths(cls, value: float) -> float:
        if abs(value * 1000 - round(value * 1000)) > 1e-6:
            raise ValueError(
                f"cpus {value!r} has more than 3 decimals: CPUs are counted in thousandths"
                " (0.001 to 1024)"
            )
        return value

    def to_resources(self) -> Resources:
        """As the scheduler counts it (millicores)."""
        return Resources(round(self.cpus * 1000), self.memory_mb, self.gpus)


class ResourcesPublic(BaseModel):
    """A job's request, as submitted: `{"cpus", "memory_mb", "gpus"}`."""

    cpus: float
    memory_mb: int
    gpus: int

    @classmethod
    def of(cls, amount: Resources) -> "ResourcesPublic":
        return cls(cpus=amount.millicpus / 1000, memory_mb=amount.memory_mb, gpus=amount.gpus)


def _check_priority(value: int) -> int:
    if not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
        raise ValueError(
            f"priority {value} is out of range: at most {PRIORITY_LIMIT} either way"
            f" (-{PRIORITY_LIMIT} to {PRIORITY_LIMIT}, operators; users within"
            " VIGIL_PRIORITY_USER_RANGE of 0)"
        )
    return value


Priority = Annotated[
    int,
    Field(
        strict=True,
        description="Its rank among its owner's jobs: higher first (age raises the others"
        " in time). A user sets it within plus or minus VIGIL_PRIORITY_USER_RANGE (100 by"
        f" default), an operator within plus or minus {PRIORITY_LIMIT}.",
    ),
    AfterValidator(_check_priority),
]


def check_priority(priority: int | None, is_operator: bool, user_range: int) -> None:
    """A 422 naming the range when a user (not an operator) gives a priority beyond
    `user_range` either way (operators' range is the schema's)."""
    if priority is None or is_operator or -user_range <= priority <= user_range:
        return
    raise invalid(
        ("body", "priority"),
        f"priority {priority} is out of range: a user may set -{user_range} to {user_range}"
        f" (VIGIL_PRIORITY_USER_RANGE); operators -{PRIORITY_LIMIT} to {PRIORITY_LIMIT}",
    )


class JobCreate(BaseModel):
    """The body of `POST /jobs`."""

    model_config = ConfigDict(extra="forbid")

    name: Name = "job"
    type: str = Field(default="shell", pattern=TYPE_PATTERN)
    command: Command | None = Field(default=None, validate_default=True)
    inputs: Inputs | None = Field(
        default=None,
        description="One task per input. Left out (or null): one empty input, or none with"
        " inputs_from. An input that is an object may name objects of the store to stage in"
        ' its work dir under the reserved key `objects`: {"objects": {PATH: {"url": ...,'
        ' "sha256": ...}}, ...} (at most 100).',
    )
    outputs: list[OutputName] = Field(
        default_factory=list,
        max_length=MAX_OUTPUTS,
        description="The files each task's command must make, by name or by pattern (`*`, `?`,"
        " `[...]`: every regular file of the work dir it matches); each is put in the object"
        " store before its task completes.",
    )
    params: dict[ParamName, ParamValue] = Field(default_factory=dict, max_length=MAX_PARAMS)
    policy: Policy = Field(default_factory=Policy)
    prerequisites: Prerequisites = Field(default_factory=Prerequisites)
    inputs_from: JobId | None = None
    files: dict[str, JobFile] = Field(
        default_factory=dict,
        max_length=bundle.MAX_FILES,
        description="The job's own files (scripts, configs, data), by relative path: placed"
        " read-only in every task's work dir, on any host. Each is given by its bytes"
        ' ({"content": base64}; at most'
        f" {bundle.MAX_BYTES // (1024 * 1024)} MiB in all) or by reference to an object of"
        ' the store ({"url": ..., "sha256": ...}; any size). At most'
        f" {bundle.MAX_FILES} files.",
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
    resources: ResourcesIn = Field(
        default_factory=ResourcesIn,
        description="What each task asks for: `cpus` (1), `memory_mb` (0), `gpus` (0).",
    )
    priority: Priority = 0

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
    def _check_files(
        cls, value: dict[str, FileIn | FileRef], info: ValidationInfo
    ) -> dict[str, FileIn | FileRef]:
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
            priority=self.priority,
            request=self.resources.to_resources(),
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


class JobWaitingPublic(WaitingReasonPublic):
    """Why a job's tasks that wait to be placed wait, and how many they are."""

    tasks: int = Field(description="Its tasks that are new and not yet placed (claimed).")

    @classmethod
    def from_waiting(cls, waiting: JobWaiting) -> "JobWaitingPublic":
        return cls(**dict(WaitingReasonPublic.of(waiting.why)), tasks=waiting.tasks)


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
        description="The job's own files: path, size, sha256, executable, and the url of"
        " those given by reference (the bytes of the others are deleted by a purge).",
    )
    waiting_on: str | None = Field(
        default=None,
        description="Why its new tasks do not start now (every host of the pool quarantined,"
        " no live worker, the job probing after failures); null when nothing holds them."
        " Given by `GET /jobs` and `GET /jobs/{id}`.",
    )
    priority: int = Field(default=0, description="Its rank among its owner's jobs (higher first).")
    resources: ResourcesPublic = Field(
        default_factory=lambda: ResourcesPublic.of(DEFAULT_REQUEST),
        description="What each of its tasks asks for (`cpus`, `memory_mb`, `gpus`).",
    )
    waiting: JobWaitingPublic | None = Field(
        default=None,
        description="Why its tasks that wait to be placed (new, unclaimed) wait: the"
        " scheduler's last reason for the job (or the job's suspension, an emergency stop),"
        " its message and numbers, and how many tasks wait; null when none does. Given by"
        " `GET /jobs/{id}` only (null in lists and in the answers to changes).",
    )

    @classmethod
    def from_job(
        cls, job: Job, pool: PoolStatus | None = None, waiting: JobWaiting | None = None
    ) -> "JobPublic":
        """The job as clients see it; with the pool's status, why it waits (if it does);
        with `waiting`, why its unplaced tasks wait (`shared.domain.waiting.job_waiting`)."""
        held = len(job.inputs) if job.inputs is not None else None
        names = set(cls.model_fields) - {"held_inputs", "waiting_on", "resources", "waiting"}
        waiting_on = None
        if pool is not None and job.state in (JobState.ACTIVE, JobState.CONFIGURING):
            counts = job.counts if job.state is JobState.ACTIVE else job.test_counts
            waiting_on = job_waiting_on(counts.get("new", 0), job.probing_since, pool)
        return cls(
            **{name: getattr(job, name) for name in names},
            held_inputs=held,
            waiting_on=waiting_on,
            resources=ResourcesPublic.of(job.request),
            waiting=JobWaitingPublic.from_waiting(waiting) if waiting is not None else None,
        )


class JobSubmitted(JobPublic):
    """The answer to `POST /jobs`: the job, and what the submitter should know before it runs."""

    warnings: list[str] = Field(
        default_factory=list,
        description="Problems found without refusing the job: a `shell` command that `bash -n`"
        " cannot parse (its tasks would fail with exit code 2), with what bash said; a request"
        " no live host of the pool can hold, naming the largest (its tasks wait, `too_large`,"
        " until one that can joins; `VIGIL_REFUSE_UNSATISFIABLE` refuses it instead).",
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
    resources: ResourcesIn | None = Field(
        default=None,
        description="What each task asks for (while configuring only; the fields left out"
        " take their defaults, as at submission).",
    )
    priority: Priority | None = Field(
        default=None, description="Its rank among its owner's jobs (in any state but cancelled)."
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
            "resources": given.get("resources", job.request.as_json()),
            "priority": given.get("priority", job.priority),
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
        if "resources" in given:  # the columns of the request (`job_edits.RESOURCE_FIELDS`)
            del given["resources"]
            request = checked.resources.to_resources()
            given |= {
                "req_millicpus": request.millicpus,
                "req_memory_mb": request.memory_mb,
                "req_gpus": request.gpus,
            }
        return given
