"""Scheduler settings (`VIGIL_*` environment variables)."""

from pydantic import Field

from shared.config import CommonSettings
from shared.topology import DEFAULT_POOL


class SchedulerSettings(CommonSettings):
    """How often the scheduler looks, how much it does per look, when a host counts as dead."""

    scheduler_tick_s: float = Field(default=0.25, gt=0, le=60)
    scheduler_batch: int = Field(default=500, ge=1, le=10000)
    #: A host whose worker has not heartbeated for this long is dead: its tasks are lost.
    dead_host_s: float = Field(default=10.0, gt=0)
    #: Published outbox rows are kept this long (for inspection), then pruned.
    outbox_keep_s: float = Field(default=3600.0, gt=0)
    worker_pool: str = DEFAULT_POOL
