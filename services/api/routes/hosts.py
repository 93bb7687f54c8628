"""`GET /hosts`: the fleet, for anyone signed in (design §9); operators act on a host or
remove it."""

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, status

from services.api import hosts
from services.api.deps import (
    AUTH_RESPONSES,
    AnalysersDep,
    CurrentUser,
    OperatorUser,
    PoolDep,
    RedisDep,
    SettingsDep,
)
from services.api.errors import invalid
from services.api.schemas.hosts import HostAction, HostPublic, HostRemoved
from shared.domain.ids import is_safe_id
from shared.messaging.redis_keys import RedisKeys
from shared.operations import draining, host_removal, quarantine

router = APIRouter(tags=["hosts"], responses=AUTH_RESPONSES)


@router.get("/hosts")
async def list_hosts(
    user: CurrentUser, pool: PoolDep, redis: RedisDep, request: Request
) -> list[HostPublic]:
    """Every host by id: heartbeat ages of its worker and supervisor, slots, running tasks
    (in-flight states), quarantine, and its `capacity` and what is `free` (CPUs, MiB, GPU
    device ids)."""
    keys: RedisKeys = request.app.state.redis_keys
    async with pool.acquire() as conn:
        found = await hosts.list_hosts(conn, redis, keys)
    return [HostPublic(**dataclasses.asdict(h)) for h in found]


@router.get("/analysers")
async def list_analysers(user: CurrentUser, analysers: AnalysersDep) -> list[str]:
    """The analysers a job's `policy.analyser` may name: `default` and those installed (as
    `vigil.analysers` entry points) where the api runs, which must match the schedulers'."""
    return sorted(analysers)


def _refusals(not_found: str, conflict: str) -> dict[int | str, dict[str, object]]:
    """The refusals of an operator's route on a host, as the contract lists them."""
    return {
        403: {"description": "The caller is not an operator."},
        404: {"description": not_found},
        409: {"description": conflict},
    }


@router.post(
    "/hosts/{host_id}/actions",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_refusals(
        "No such host.", "Release of a host not quarantined, undrain of one not draining."
    ),
)
async def act_on_host(
    user: OperatorUser,
    host_id: Annotated[str, Path(description="A host id.")],
    body: HostAction,
    pool: PoolDep,
) -> dict[str, str]:
    """Quarantine, release, drain or undrain a host, operators only."""
    _check_id(host_id)
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


@router.delete(
    "/hosts/{host_id}",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_refusals(
        "No such host, or removed already.",
        "The host is alive and holds tasks (drain it first, or force).",
    ),
)
async def remove_host(
    user: OperatorUser,
    host_id: Annotated[str, Path(description="A host id.")],
    pool: PoolDep,
    settings: SettingsDep,
    force: Annotated[
        bool, Query(description="Remove it even alive and holding tasks: they are lost.")
    ] = False,
) -> HostRemoved:
    """Remove a host, operators only: it leaves `GET /hosts` and takes no work; the tasks its
    workers hold are lost (a dead host's rules: a restartable job's run again elsewhere), its
    running worker stops, and its queues are deleted once nothing in them is owed. 409 if it
    is alive and holds tasks, unless `force`. A worker that registers under its id later
    brings it back as a new host."""
    _check_id(host_id)
    async with pool.acquire() as conn:
        done = await host_removal.remove(
            conn, host_id, user.name, force=force, dead_after_s=settings.dead_host_s
        )
    return HostRemoved(host=done.host, tasks_lost=done.tasks_lost)


def _check_id(host_id: str) -> None:
    if not is_safe_id(host_id):
        raise invalid(("path", "host_id"), f"host id {host_id[:100]!r} is not a valid id")
