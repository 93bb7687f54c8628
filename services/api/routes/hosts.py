"""`GET /hosts`: the fleet, for anyone signed in (design §9)."""

import dataclasses
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request, status
from pydantic import BaseModel, ConfigDict, Field

from services.api import hosts
from services.api.deps import (
    AUTH_RESPONSES,
    AnalysersDep,
    CurrentUser,
    OperatorUser,
    PoolDep,
    RedisDep,
)
from services.api.errors import invalid
from shared import draining, quarantine
from shared.ids import is_safe_id
from shared.redis_keys import RedisKeys

router = APIRouter(tags=["hosts"], responses=AUTH_RESPONSES)


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


@router.get("/hosts")
async def list_hosts(
    user: CurrentUser, pool: PoolDep, redis: RedisDep, request: Request
) -> list[HostPublic]:
    """Every host by id: heartbeat ages of its worker and supervisor, slots, running tasks
    (in-flight states) and quarantine."""
    keys: RedisKeys = request.app.state.redis_keys
    async with pool.acquire() as conn:
        found = await hosts.list_hosts(conn, redis, keys)
    return [HostPublic(**dataclasses.asdict(h)) for h in found]


@router.get("/analysers")
async def list_analysers(user: CurrentUser, analysers: AnalysersDep) -> list[str]:
    """The analysers a job's `policy.analyser` may name: `default` and those installed (as
    `vigil.analysers` entry points) where the api runs, which must match the schedulers'."""
    return sorted(analysers)


class HostAction(BaseModel):
    """`release` ends a host's quarantine; `quarantine` stops it taking new tasks (for
    `duration_s`); `drain` lets it finish what it holds and take nothing new until `undrain`."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["release", "quarantine", "drain", "undrain"]
    reason: str = Field(default="", max_length=500)
    duration_s: float = Field(default=quarantine.DEFAULT_QUARANTINE_S, gt=0, le=365 * 86400)


@router.post(
    "/hosts/{host_id}/actions",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        403: {"description": "The caller is not an operator."},
        404: {"description": "No such host."},
        409: {"description": "Release of a host not quarantined, undrain of one not draining."},
    },
)
async def act_on_host(
    user: OperatorUser,
    host_id: Annotated[str, Path(description="A host id.")],
    body: HostAction,
    pool: PoolDep,
) -> dict[str, str]:
    """Quarantine, release, drain or undrain a host, operators only."""
    if not is_safe_id(host_id):
        raise invalid(("path", "host_id"), f"host id {host_id[:100]!r} is not a valid id")
    async with pool.acquire() as conn:
        if body.action == "release":
            await quarantine.release(conn, host_id, user.name)
        elif body.action == "quarantine":
            await quarantine.quarantine(conn, host_id, user.name, body.reason, body.duration_s)
        elif body.action == "drain":
            await draining.drain(conn, host_id)
        else:
            await draining.undrain(conn, host_id)
    return {"host": host_id, "action": body.action}
