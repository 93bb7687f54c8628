"""Views and bodies of `/pilots`."""

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.store.pilots_repo import Pilot


class PilotRequest(BaseModel):
    """Pilots to ask the batch system for: how many, each with what, for how long."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=1, le=100)
    walltime_s: int = Field(default=3600, ge=60, le=30 * 86400)
    cpus: int = Field(default=1, ge=1, le=4096)
    memory_mb: int | None = Field(default=None, ge=1, le=64 * 1024 * 1024)
    gpus: int = Field(default=0, ge=0, le=64)


class PilotPublic(BaseModel):
    """One pilot: its state (`requested`, `pending` in the batch system with its `reason`,
    `running`, `draining`, `ended` with why), its batch job, and once it has run, its host
    and when its allocation ends (none while pending)."""

    id: str
    pool: str
    backend: str
    state: str
    batch_job_id: str | None
    host_id: str | None
    cpus: int
    memory_mb: int | None
    gpus: int
    walltime_s: int
    reason: str | None
    requested_by: str
    created_at: datetime
    started_at: datetime | None
    ends_at: datetime | None
    ended_at: datetime | None
    idle_since: datetime | None

    @classmethod
    def of(cls, pilot: Pilot) -> "PilotPublic":
        return cls(**vars(pilot))
