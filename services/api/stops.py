"""Bodies and views of the emergency stop routes (`/admin/emergency-stop`, `/admin/resume`)."""

from datetime import datetime
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from services.api import json_values
from services.api.schemas import TEXT_PATTERN
from shared.emergency import Resumed, Stop

MAX_REASON_CHARS: Final = 500


def _check_reason(reason: str) -> str:
    problem = json_values.text_problem(reason)
    if problem:
        raise ValueError(f"reason {problem}")
    if not reason.strip():
        raise ValueError("reason must not be blank")
    return reason


Reason = Annotated[
    str,
    Field(min_length=1, max_length=MAX_REASON_CHARS, pattern=TEXT_PATTERN),
    AfterValidator(_check_reason),
]


class EmergencyStopRequest(BaseModel):
    """The body of `POST /admin/emergency-stop`: why (kept with the stop and in every brief)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason = Field(description="Why everything is stopped (1 to 500 characters).")


class EmergencyStopPublic(BaseModel):
    """An emergency stop: who, when, why, what it did, and who resumed it (null: in force)."""

    id: int
    stopped_by: str
    stopped_at: datetime
    reason: str
    jobs_suspended: int
    tasks_killed: int
    resumed_by: str | None
    resumed_at: datetime | None

    @classmethod
    def from_stop(cls, stop: Stop) -> "EmergencyStopPublic":
        return cls(**{name: getattr(stop, name) for name in cls.model_fields})


class EmergencyStatus(BaseModel):
    """`GET /admin/emergency-stop`: the latest stop (null: never any), and whether it holds."""

    in_force: bool
    latest: EmergencyStopPublic | None


class EmergencyResumePublic(BaseModel):
    """What `POST /admin/resume` did: the stop (now resumed), jobs resumed, tasks recovered."""

    stop: EmergencyStopPublic
    jobs_resumed: list[str]
    tasks_recovered: list[str]

    @classmethod
    def from_resumed(cls, resumed: Resumed) -> "EmergencyResumePublic":
        return cls(
            stop=EmergencyStopPublic.from_stop(resumed.stop),
            jobs_resumed=resumed.jobs_resumed,
            tasks_recovered=resumed.tasks_recovered,
        )
