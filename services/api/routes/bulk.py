"""`/bulk/actions`: global fixes, one task action on every task a selector matches.

Operators select across every job; a user's selector is limited to their own jobs, and they
see only their own records. The work is `shared.operations.bulk`'s.
"""

from typing import Annotated, Any, Final

from fastapi import APIRouter, Query

from services.api.deps import (
    AUTH_RESPONSES,
    QUOTA_RESPONSES,
    CurrentUser,
    PoolDep,
    SettingsDep,
    TaskQuotaDep,
)
from services.api.errors import invalid
from services.api.schemas.bulk import BulkActionPublic, BulkActionRequest
from services.api.settings import ApiSettings
from shared.operations import bulk
from shared.store import bulk_repo

router = APIRouter(prefix="/bulk", tags=["bulk"], responses=AUTH_RESPONSES)

_REFUSED: Final[dict[int | str, dict[str, Any]]] = QUOTA_RESPONSES | {
    409: {
        "description": "The selector matches more tasks than the confirmation threshold and"
        " `confirm` is not true; nothing was changed."
    },
    422: {
        "description": "A bad body: an empty selector, an unknown field or value, or a"
        " selector matching more tasks than one bulk action may touch."
    },
}


def _limits(settings: ApiSettings) -> bulk.Limits:
    return bulk.Limits(settings.bulk_max_tasks, settings.bulk_confirm_over, settings.bulk_batch)


@router.post("/actions", responses=_REFUSED)
async def bulk_action(
    user: CurrentUser,
    body: BulkActionRequest,
    pool: PoolDep,
    settings: SettingsDep,
    quota: TaskQuotaDep,
) -> BulkActionPublic:
    """Apply `action` to every task `selector` matches (a user: among their own jobs): 200.

    Each task is acted on as by `POST /tasks/{id}/actions`; a task whose state does not allow
    it is refused and counted by reason, the others go on. `dry_run` changes nothing and says
    what would happen. Recorded either way (`GET /bulk/actions`).
    """
    async with pool.acquire() as conn:
        try:
            outcome = await bulk.run(
                conn,
                body.to_request(),
                user,
                _limits(settings),
                charge=lambda tasks: quota.charge(user, tasks),
            )
        except bulk.TooManyTasks as exc:
            raise invalid(("body", "selector"), str(exc)) from exc
    return BulkActionPublic.from_outcome(outcome)


@router.get("/actions")
async def bulk_actions(
    user: CurrentUser,
    pool: PoolDep,
    limit: Annotated[int, Query(ge=1, le=500, description="Most records returned.")] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="Only records with a smaller id.")
    ] = None,
) -> list[bulk_repo.BulkRecord]:
    """The recorded bulk actions, dry runs included, newest first (a user: only their own)."""
    actor = None if user.is_operator else user.id
    async with pool.acquire() as conn:
        return await bulk_repo.latest(conn, actor, limit, before)
