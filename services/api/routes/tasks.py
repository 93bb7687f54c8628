"""`/tasks/{task_id}`: one task with its prerequisites and attempts, and the actions on it."""

import logging
from typing import Any, Final

from fastapi import APIRouter, status

from services.api import queries, waiting
from services.api.access import visible_task
from services.api.deps import (
    AUTH_RESPONSES,
    QUOTA_RESPONSES,
    CurrentUser,
    PoolDep,
    TaskIdPath,
    TaskQuotaDep,
)
from services.api.schemas.tasks import (
    PrerequisitePublic,
    TaskActionPublic,
    TaskActionRequest,
    TaskDetail,
    TaskPublic,
)
from shared.operations import task_actions
from shared.store import attempts_repo

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/tasks", tags=["tasks"], responses=AUTH_RESPONSES)

_NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {
    404: {"description": "No such task, or it belongs to another user's job."}
}
_CONFLICT: Final[dict[int | str, dict[str, Any]]] = {
    409: {"description": "The task's state does not allow the action; the detail says why."}
}


@router.get("/{task_id}", responses=_NOT_FOUND)
async def get_task(user: CurrentUser, task_id: TaskIdPath, pool: PoolDep) -> TaskDetail:
    """The task, what it waits for, every attempt of it (oldest first), and why it waits
    (`waiting_reason`) if it does."""
    async with pool.acquire() as conn:
        task = await visible_task(conn, user, task_id)
        found = await queries.prerequisites_of(conn, [task.id])
        attempts = await attempts_repo.list_for_task(conn, task.id)
        timing = (await queries.timings_of(conn, [task])).get(task.id)
        why = await waiting.of_task(conn, task)
    prerequisites = [PrerequisitePublic.model_validate(p) for p in found.get(task.id, [])]
    return TaskDetail.from_parts(
        task, prerequisites, attempts, detail=user.is_operator, timing=timing, waiting=why
    )


@router.post(
    "/{task_id}/actions",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_NOT_FOUND | _CONFLICT | QUOTA_RESPONSES,
)
async def act_on_task(
    user: CurrentUser,
    task_id: TaskIdPath,
    body: TaskActionRequest,
    pool: PoolDep,
    quota: TaskQuotaDep,
) -> TaskActionPublic:
    """Recover, restart, duplicate, cancel, hold or release the task: 202 with the task.

    A hook the action needs runs later on the task's host. `created` is the new task of a
    `duplicate` (null otherwise). 409 names the current state and the states that allow it.
    """
    async with pool.acquire() as conn, conn.transaction():
        await visible_task(conn, user, task_id)
        result = await task_actions.apply_to_task(conn, task_id, body.action, actor=user.name)
        await quota.charge(user, 1 if result.created else 0)
        made = [t for t in (result.task, result.created) if t is not None]
        found = await queries.prerequisites_of(conn, [t.id for t in made])
    logger.info(
        "task %s %s: now %s",
        task_id,
        body.action.value,
        result.task.state.value,
        extra={"action": body.action.value, "task_id": task_id, "user": user.name},
    )
    shown = user.is_operator
    created = TaskPublic.from_found(result.created, found, detail=shown) if result.created else None
    task = TaskPublic.from_found(result.task, found, detail=shown)
    return TaskActionPublic(task=task, created=created)
