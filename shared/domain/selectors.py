"""Selecting tasks across jobs (global fixes): `TaskSelector` and the SQL it becomes.

Pure: no I/O. `where()` turns a selector into a WHERE clause over `tasks t JOIN jobs j` in
which every value is a bind parameter. A job name glob (`*` any run of characters, `?` one
character, everything else literal) becomes a LIKE pattern with `%`, `_` and `\\` escaped, so a
name holding them matches only itself. Test runs of a configuring job (negative index) are
never selected: they are their owner's trial, not production work.
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from shared.domain.ids import is_safe_id
from shared.domain.states import FailureClass, TaskState

#: Most values one list criterion (hosts, job ids) may hold.
MAX_LISTED: Final = 1000
#: Longest job name pattern (a job name is at most 200 characters).
MAX_PATTERN_CHARS: Final = 200
#: The criteria of a selector: at least one must be given.
CRITERIA: Final = (
    "states",
    "failure_classes",
    "hosts",
    "job_ids",
    "job_name",
    "updated_after",
    "updated_before",
)
EMPTY: Final = "the selector is empty: name at least one of " + ", ".join(CRITERIA)


def _safe_id(kind: str) -> AfterValidator:
    def check(value: str) -> str:
        if not is_safe_id(value):
            raise ValueError(f"{kind} id {value[:100]!r} is not a valid id")
        return value

    return AfterValidator(check)


def _check_pattern(pattern: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in pattern):
        raise ValueError("job_name must be printable text (no control characters)")
    return pattern  # a lone surrogate is refused by pydantic already (string_unicode)


def _check_time(value: datetime) -> datetime:
    # A time near year 1 or 9999 with an offset cannot be converted to UTC (the database
    # stores UTC): refuse it here rather than fail as a 500 when it is sent.
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range once converted to UTC") from None
    return value


HostId = Annotated[str, _safe_id("host")]
JobId = Annotated[str, _safe_id("job")]
Pattern = Annotated[
    str, Field(min_length=1, max_length=MAX_PATTERN_CHARS), AfterValidator(_check_pattern)
]
Time = Annotated[AwareDatetime, AfterValidator(_check_time)]


class TaskSelector(BaseModel):
    """Which tasks a bulk action touches: the tasks matching every criterion given (and any
    value of a list criterion). At least one criterion is required (422 otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    states: list[TaskState] = Field(
        default_factory=list, max_length=len(TaskState), description="Tasks in one of these."
    )
    failure_classes: list[FailureClass] = Field(
        default_factory=list,
        max_length=len(FailureClass),
        description="Tasks whose last failure has one of these classes.",
    )
    hosts: list[HostId] = Field(
        default_factory=list, max_length=MAX_LISTED, description="Tasks on one of these hosts."
    )
    job_ids: list[JobId] = Field(
        default_factory=list, max_length=MAX_LISTED, description="Tasks of one of these jobs."
    )
    job_name: Pattern | None = Field(
        default=None,
        description="Tasks of jobs whose name matches this glob: `*` any characters, `?` one;"
        " case-sensitive.",
    )
    updated_after: Time | None = Field(
        default=None, description="Tasks last changed at or after this time (with an offset)."
    )
    updated_before: Time | None = Field(
        default=None, description="Tasks last changed before this time (with an offset)."
    )
    include_superseded: bool = Field(
        default=False, description="Also failed tasks already replaced by a resubmitted clone."
    )

    @model_validator(mode="after")
    def _check_criteria(self) -> "TaskSelector":
        if not any(getattr(self, name) for name in CRITERIA):
            raise ValueError(EMPTY)
        after, before = self.updated_after, self.updated_before
        if after is not None and before is not None and after >= before:
            raise ValueError("updated_after must be earlier than updated_before")
        return self


def like_pattern(glob: str) -> str:
    """The LIKE pattern (escape character `\\`) matching what the glob `glob` matches."""
    out = []
    for char in glob:
        if char == "*":
            out.append("%")
        elif char == "?":
            out.append("_")
        elif char in "%_\\":
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


@dataclass(frozen=True)
class Where:
    """A WHERE clause over `tasks t JOIN jobs j` and its bind arguments (`$1`...)."""

    sql: str
    args: list[Any]


def where(selector: TaskSelector, owner_id: str | None) -> Where:
    """The clause matching `selector`, limited to `owner_id`'s jobs unless it is None (an
    operator). Values are always bind parameters, never text in the SQL."""
    conditions = _criteria(selector)
    if owner_id is not None:
        conditions.append(("j.owner_id = {}", owner_id))
    clauses = [sql.format(f"${n}") for n, (sql, _value) in enumerate(conditions, start=1)]
    if not selector.include_superseded:
        clauses.append("t.superseded_by IS NULL")
    clauses.append(
        "NOT t.test"
    )  # not the test runs of a configuring job (shared.operations.configuring)
    return Where(" AND ".join(clauses), [value for _sql, value in conditions])


def _criteria(selector: TaskSelector) -> list[tuple[str, Any]]:
    # (SQL with `{}` where its bind parameter goes, value) for each criterion given.
    name = like_pattern(selector.job_name) if selector.job_name is not None else None
    found: list[tuple[str, Any]] = [
        ("t.state = ANY({}::task_state[])", sorted({s.value for s in selector.states})),
        ("t.failure_class = ANY({}::failure_class[])", sorted(set(selector.failure_classes))),
        ("t.host = ANY({}::text[])", sorted(set(selector.hosts))),
        ("t.job_id = ANY({}::text[])", sorted(set(selector.job_ids))),
        ("j.name LIKE {} ESCAPE '\\'", name),
        ("t.updated_at >= {}", selector.updated_after),
        ("t.updated_at < {}", selector.updated_before),
    ]
    return [(sql, value) for sql, value in found if value]
