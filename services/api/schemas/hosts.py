"""Views and bodies of `/hosts`."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.operations import quarantine


class HostAmount(BaseModel):
    """An amount of a host's resources: CPUs, memory in MiB, and its GPUs by device id."""

    cpus: float
    memory_mb: int
    gpus: list[str]


class HostPublic(BaseModel):
    """One host. Ages are in seconds (null: never heard of); `worker_registered` is null when
    Redis does not answer."""

    id: str
    slots: int
    worker: str | None
    worker_registered: bool | None
    worker_heartbeat_age_s: float | None
    supervisor_heartbeat_age_s: float | None
    running_tasks: int
    quarantined: bool
    quarantined_until: datetime | None
    quarantine_reason: str | None
    started_at: datetime | None
    pool: str | None = None
    breaker: bool = Field(
        default=False,
        description="Quarantined by its breaker: it probes one task at a time after a"
        " cool-down and is released by a probe that ends well (an operator's quarantine is not).",
    )
    probing_since: datetime | None = None
    draining: bool = Field(
        default=False,
        description="An operator drains it: it finishes the tasks it holds and takes no new one.",
    )
    capacity: HostAmount = Field(
        default_factory=lambda: HostAmount(cpus=0, memory_mb=0, gpus=[]),
        description="What its worker advertised (0 CPUs until it did).",
    )
    free: HostAmount = Field(
        default_factory=lambda: HostAmount(cpus=0, memory_mb=0, gpus=[]),
        description="Its capacity less what its tasks hold (each its job's request and its"
        " GPU devices, from its placement to its command's end); never below 0.",
    )


class HostAction(BaseModel):
    """`release` ends a host's quarantine; `quarantine` stops it taking new tasks (for
    `duration_s`); `drain` lets it finish what it holds and take nothing new until `undrain`."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["release", "quarantine", "drain", "undrain"]
    reason: str = Field(default="", max_length=500)
    duration_s: float = Field(default=quarantine.DEFAULT_QUARANTINE_S, gt=0, le=365 * 86400)


class HostRemoved(BaseModel):
    """A host an operator removed, and how many tasks its workers held were lost with it."""

    host: str
    removed: Literal[True] = True
    tasks_lost: int
