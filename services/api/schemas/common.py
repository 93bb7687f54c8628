"""What the api's schemas share: limits, checked names, ids, inputs and outputs."""

import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
)

from services.api import json_values
from shared.domain import object_refs
from shared.domain.ids import is_safe_id
from shared.domain.waiting import ALL_REASONS, Why

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
    size = json_values.size_over(value, MAX_INPUT_BYTES)
    if size is not None:
        raise ValueError(f"input is {size} bytes as JSON; the limit is {MAX_INPUT_BYTES}")
    object_refs.input_objects(value)  # the form of the objects it names, if any
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


class WaitingReasonPublic(BaseModel):
    """Why a task (or a job's tasks) waits: one reason, a sentence, and its numbers."""

    reason: str = Field(
        description="One of: "
        + ", ".join(ALL_REASONS)
        + " (docs/explanation/scheduling.md, Reasons)."
    )
    message: str
    detail: dict[str, Any] = Field(
        default_factory=dict,
        description="The reason's numbers: amounts as `{cpus, memory_mb, gpus}`, hosts, jobs,"
        " tasks ahead.",
    )

    @classmethod
    def of(cls, why: Why) -> "WaitingReasonPublic":
        return cls(reason=why.reason, message=why.message, detail=dict(why.detail))
