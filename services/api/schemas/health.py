"""The answer of `/healthz`."""

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)


class Health(BaseModel):
    """`ok`; `degraded` when the api answers but something it relies on does not (the
    reasons say what); `unavailable` when the database does not answer."""

    status: Literal["ok", "degraded", "unavailable"]
    reasons: list[str] = Field(default_factory=list)
