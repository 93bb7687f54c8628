"""Every message on the wire: immutable pydantic models discriminated by `type`.

Work messages (`RunStage`, `WatchProcess`) go through the work exchange; events (`TaskEvent`,
`JobEvent`, `LogRecord`) go through the events exchange under `task.<state>.<job>`,
`job.<outcome>.<job>` and `log.<severity>.<job>`. Messages carry ids, not rows, but for one: a
claim's `RunStage` carries its task's row as claimed, which spares a worker's take its read
(`docs/explanation/architecture.md`, "Departures from the brief, and why").
Consumers are tolerant readers (`extra="ignore"`); `decode()` raises one `InvalidMessage`.

The bodies of the events the outbox holds (`TaskEvent`, `TaskDecision`, `JobEvent`,
`HostEvent`) are made by PostgreSQL, one function per type (`shared/store/outbox.py`): these
models give those functions their fields from Python and read the bodies; a log line, which
the worker publishes itself and no database holds, is the one event dumped from its model.
"""

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID, uuid4

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.domain.errors import InvalidMessage
from shared.domain.states import FailureClass, Stage, TaskState


def now_utc() -> datetime:
    """The current time, timezone-aware."""
    return datetime.now(UTC)


class Severity(StrEnum):
    """Severity of a log record; the order of the members is the order of gravity."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"
    FATAL = "fatal"


class JobOutcome(StrEnum):
    """The `<outcome>` word of `job.<outcome>.<job id>` events."""

    SUCCEEDED = "succeeded"  # every task completed
    FAILED = "failed"  # the job ended with at least one failed task, or a task failed
    CRASHED = "crashed"  # a process died of a signal or lost its worker
    HUNG = "hung"  # a process showed no sign of life for hang_timeout
    CANCELLED = "cancelled"  # a user cancelled the job
    PURGED = "purged"  # the job's logs, kept outputs and work dirs were removed
    ACTIVATED = "activated"  # a configuring job went into production


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    message_id: UUID = Field(default_factory=uuid4)
    sent_at: AwareDatetime = Field(default_factory=now_utc)


class RunStage(_Message):
    """Ask a worker to take `task_id` from its current state onward, fenced by `claim`."""

    type: Literal["run_stage"] = "run_stage"
    job_id: str
    task_id: str
    stage: Stage
    claim: UUID
    #: The task's row as its claim left it (`tasks_repo.Task.from_json`) and its job's row
    #: version then (`jobs.xmin`), from the planning round's claim: a worker that knows the
    #: job at that version takes the task without reading either (`services/worker/claims.py`).
    #: None: the worker reads them.
    claimed: dict[str, Any] | None = None
    job_version: int | None = None
    #: The job's row at `job_version` (`jobs_repo.Job.from_json`), in the message of its first
    #: input's task: a job of one task is then taken without a read too.
    job: dict[str, Any] | None = None


class WatchProcess(_Message):
    """Hand a started process to the host's supervisor: identified by pid and create time."""

    type: Literal["watch_process"] = "watch_process"
    job_id: str
    task_id: str
    claim: UUID
    pid: int
    create_time: float
    #: How long it had run when it was handed over (the worker hands over only what runs
    #: `follow_after_s`): the supervisor follows it that much sooner.
    ran_s: float = Field(default=0.0, ge=0)


class KillTask(_Message):
    """Ask the supervisor of a host to kill a task's process tree (cancelled, or lost and about
    to be resubmitted); it then marks the attempt's process reaped."""

    type: Literal["kill_task"] = "kill_task"
    job_id: str
    task_id: str
    pid: int
    create_time: float
    reason: str
    claim: UUID | None = None  # the attempt's claim: names its cgroup, if it has one


class FreezeTask(_Message):
    """Ask the supervisor of a host to stop (SIGSTOP) or continue (SIGCONT) a task's process
    tree: its job was suspended or resumed."""

    type: Literal["freeze_task"] = "freeze_task"
    job_id: str
    task_id: str
    pid: int
    create_time: float
    claim: UUID | None = None
    frozen: bool


class RemoveWorkdirs(_Message):
    """Ask the worker of a host to delete work dirs of `job_id` (its job was purged, or test
    tasks were thrown away); only dirs inside its work root are removed. Idempotent."""

    type: Literal["remove_workdirs"] = "remove_workdirs"
    job_id: str
    task_ids: list[str]
    workdirs: list[str]
    reason: str = ""


class _Event(_Message):
    """An event of the history: the relay gives it its position (`seq`) as it publishes it
    (never written by the producer, so left out when one is encoded here)."""

    seq: int | None = Field(default=None, exclude=True)


class TaskEvent(_Event):
    """A task changed state (`task.<state>.<job id>`)."""

    type: Literal["task_event"] = "task_event"
    job_id: str
    task_id: str
    state: TaskState
    previous: TaskState | None = None
    run_number: int = 1
    host: str | None = None
    failure_class: FailureClass | None = None
    exit_code: int | None = None
    signal: int | None = None
    error_brief: str | None = None


class JobEvent(_Event):
    """A job-level outcome (`job.<outcome>.<job id>`): finished, or one of its tasks crashed."""

    type: Literal["job_event"] = "job_event"
    job_id: str
    outcome: JobOutcome
    task_id: str | None = None
    brief: str | None = None


class TaskDecision(_Event):
    """The triage decided about a failed task (`task.<verdict>.<job id>`): `recovered`,
    `resubmitted` or `abandoned` (see `shared.domain.analyser.Verdict`)."""

    type: Literal["task_decision"] = "task_decision"
    job_id: str
    task_id: str
    verdict: str
    reason: str
    failure_class: FailureClass | None = None


class HostState(StrEnum):
    """What a host's quarantine did (`host.<state>.<host>`): shut (by the breaker or an
    operator), letting one task through to probe, or open to work again; or an operator
    removed the host."""

    QUARANTINED = "quarantined"
    PROBING = "probing"
    RELEASED = "released"
    REMOVED = "removed"


class HostEvent(_Event):
    """A host's quarantine changed, or an operator removed it (`host.<state>.<host>`);
    `until` is when a shut breaker probes next (an operator's quarantine: when it runs
    out)."""

    type: Literal["host_event"] = "host_event"
    host: str
    state: HostState
    reason: str | None = None
    until: AwareDatetime | None = None
    by: str = "breaker"


class LogRecord(_Message):
    """One output line of a task's command (`log.<severity>.<job id>`)."""

    type: Literal["log"] = "log"
    job_id: str
    task_id: str
    run_number: int
    attempt: int
    line_no: int  # order of the line within its attempt, both streams together
    severity: Severity
    stream: Literal["stdout", "stderr"]
    line: str
    ts: AwareDatetime = Field(default_factory=now_utc)
    progress: int | None = None


#: What a host asks the signer for (`SignRequest.op`): a single PUT, a multipart upload's
#: start, its parts (with its completion and abort), a GET, a HEAD.
SignOp = Literal["put", "create", "parts", "get", "head"]


class SignRequest(_Message):
    """A host asks the control plane's signer (`services/scheduler/signer.py`) for the link of
    one request on one object of the store, for a task it holds (`task_id` under `claim`):
    a write of one of that task's output keys, or a read of an object the task needs. Sent
    to the signer's queue with a reply-to (`SignReply`); never to an exchange."""

    type: Literal["sign_request"] = "sign_request"
    host_id: str
    task_id: str
    claim: UUID
    op: SignOp
    #: The object's key (under the store's prefix).
    key: str
    #: put, create: the sha256 the object will carry (its signed metadata).
    sha256: str | None = None
    #: parts: the upload (its `create`'s answer), and which parts (1-based, at most 1000).
    upload_id: str | None = None
    first_part: int = Field(default=1, ge=1, le=10_000)
    parts: int = Field(default=0, ge=0, le=1000)


class SignReply(_Message):
    """The signer's answer: the signed links (one, or a multipart upload's parts in order,
    with its completion and abort) and the headers each request must carry; or, when the
    host may not make it, why (`refused`)."""

    type: Literal["sign_reply"] = "sign_reply"
    urls: list[str] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict)
    complete: str | None = None
    abort: str | None = None
    refused: str | None = None


Message = Annotated[
    RunStage
    | WatchProcess
    | KillTask
    | FreezeTask
    | RemoveWorkdirs
    | TaskEvent
    | TaskDecision
    | JobEvent
    | HostEvent
    | LogRecord
    | SignRequest
    | SignReply,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def encode(message: _Message) -> bytes:
    """The JSON bytes of `message`."""
    return message.model_dump_json().encode()


def decode(body: bytes | str) -> Message:
    """Parse a message body; raises `InvalidMessage` for anything that is not one of ours."""
    try:
        return _ADAPTER.validate_json(body)
    except ValidationError as exc:
        raise InvalidMessage(str(exc)) from exc


def to_jsonable(message: _Message) -> dict[str, Any]:
    """`message` as a JSON-ready dict (for the outbox's jsonb column)."""
    return message.model_dump(mode="json")
