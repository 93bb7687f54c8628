"""`/pilots`: hosts asked of the batch system as pilot jobs. Operators ask for and
withdraw them; anyone signed in sees them. Only the leading scheduler talks to the batch
system (`services/scheduler/pilots.py`): these routes write what it is to do."""

from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, status

from services.api.deps import AUTH_RESPONSES, CurrentUser, OperatorUser, PoolDep, SettingsDep
from services.api.errors import invalid
from services.api.schemas.pilots import PilotPublic, PilotRequest
from shared.domain.errors import Conflict, NotFound
from shared.domain.ids import is_safe_id
from shared.store import pilots_repo

router = APIRouter(tags=["pilots"], responses=AUTH_RESPONSES)

_OPERATORS: Final[dict[int | str, dict[str, Any]]] = {
    403: {"description": "The caller is not an operator."}
}


@router.post(
    "/pilots",
    status_code=status.HTTP_201_CREATED,
    responses=_OPERATORS | {409: {"description": "No batch system is configured."}},
)
async def request_pilots(
    user: OperatorUser, body: PilotRequest, pool: PoolDep, settings: SettingsDep
) -> list[PilotPublic]:
    """Ask for `count` pilots of `cpus`, `memory_mb`, `gpus` for `walltime_s`: 201 with them,
    `requested` (the scheduler submits them at its next look)."""
    if settings.pilots_backend == "none":
        raise Conflict(
            "no batch system is configured for pilots",
            next_step="set VIGIL_PILOTS_BACKEND=slurm for the api and the scheduler",
        )
    ask = pilots_repo.Ask(body.cpus, body.walltime_s, body.memory_mb, body.gpus)
    async with pool.acquire() as conn:
        made = await pilots_repo.request(
            conn, settings.worker_pool, settings.pilots_backend, ask, body.count, user.name
        )
    return [PilotPublic.of(p) for p in made]


@router.get("/pilots")
async def list_pilots(user: CurrentUser, pool: PoolDep, live: bool = False) -> list[PilotPublic]:
    """The pilots, newest first (only those not ended with `live=true`), at most 500."""
    async with pool.acquire() as conn:
        found = await pilots_repo.listed(conn, live=live)
    return [PilotPublic.of(p) for p in found]


@router.delete(
    "/pilots/{pilot_id}",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_OPERATORS | {404: {"description": "No such pilot."}},
)
async def withdraw_pilot(
    user: OperatorUser,
    pilot_id: Annotated[str, Path(description="A pilot id (p-...).")],
    pool: PoolDep,
) -> PilotPublic:
    """Stop a pilot: 202 with it. One not yet submitted ends at once; one submitted drains
    and its batch job is cancelled (its running tasks are a lost host's: a restartable job's
    resubmitted elsewhere, another's abandoned, `docs/how-to/pilots.md`); an ended one is returned
    as it is."""
    if not is_safe_id(pilot_id):
        raise invalid(("path", "pilot_id"), f"pilot id {pilot_id[:100]!r} is not a valid id")
    async with pool.acquire() as conn:
        pilot = await pilots_repo.withdraw(conn, pilot_id, f"cancelled by {user.name}")
    if pilot is None:
        raise NotFound(f"no pilot {pilot_id}")
    return PilotPublic.of(pilot)
