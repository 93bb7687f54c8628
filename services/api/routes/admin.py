"""`/admin/*` (operators only): the emergency stop and its resume (design §8, §9)."""

import logging
from typing import Any, Final

from fastapi import APIRouter, status

from services.api.deps import AUTH_RESPONSES, OperatorUser, PoolDep
from services.api.stops import (
    EmergencyResumePublic,
    EmergencyStatus,
    EmergencyStopPublic,
    EmergencyStopRequest,
)
from shared import emergency

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/admin", tags=["admin"], responses=AUTH_RESPONSES)

_OPERATORS: Final[dict[int | str, dict[str, Any]]] = {
    403: {"description": "The caller is not an operator."}
}


@router.post(
    "/emergency-stop",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_OPERATORS | {409: {"description": "A stop is already in force."}},
)
async def emergency_stop(
    user: OperatorUser, body: EmergencyStopRequest, pool: PoolDep
) -> EmergencyStopPublic:
    """Suspend every active job and kill every running command, in one transaction: 202.

    Killed tasks end `failed_on_cluster` with class `cancelled` and the brief
    `emergency stop by <operator>: <reason>`. Jobs submitted during the stop are created
    suspended. 409 while a stop is already in force.
    """
    async with pool.acquire() as conn:
        stop = await emergency.stop(conn, user.name, body.reason)
    return EmergencyStopPublic.from_stop(stop)


@router.get("/emergency-stop", responses=_OPERATORS)
async def emergency_status(user: OperatorUser, pool: PoolDep) -> EmergencyStatus:
    """The latest emergency stop (null if there never was one) and whether it is in force."""
    async with pool.acquire() as conn:
        latest = await emergency.latest(conn)
    view = EmergencyStopPublic.from_stop(latest) if latest else None
    return EmergencyStatus(in_force=bool(latest and latest.resumed_at is None), latest=view)


@router.post(
    "/resume",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_OPERATORS | {409: {"description": "No stop is in force."}},
)
async def emergency_resume(user: OperatorUser, pool: PoolDep) -> EmergencyResumePublic:
    """Undo the stop in force: 202.

    The jobs it suspended that are still suspended are resumed, and the tasks it killed that
    are still failed as `cancelled` are recovered. 409 when no stop is in force.
    """
    async with pool.acquire() as conn:
        resumed = await emergency.resume(conn, user.name)
    return EmergencyResumePublic.from_resumed(resumed)
