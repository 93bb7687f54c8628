"""`GET /tasks/{task_id}`: one task with its prerequisites and its attempts audit."""

from typing import Any

from fastapi import APIRouter

from services.api import queries
from services.api.access import visible_task
from services.api.deps import CurrentUser, PoolDep, TaskIdPath
from services.api.schemas import PrerequisitePublic, TaskDetail
from shared import attempts_repo

router = APIRouter(prefix="/tasks", tags=["tasks"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such task, or it belongs to another user's job."}
}


@router.get("/{task_id}", responses=_NOT_FOUND)
async def get_task(user: CurrentUser, task_id: TaskIdPath, pool: PoolDep) -> TaskDetail:
    """The task, what it waits for, and every attempt of it (oldest first)."""
    async with pool.acquire() as conn:
        task = await visible_task(conn, user, task_id)
        found = await queries.prerequisites_of(conn, [task.id])
        attempts = await attempts_repo.list_for_task(conn, task.id)
    prerequisites = [PrerequisitePublic.model_validate(p) for p in found.get(task.id, [])]
    return TaskDetail.from_parts(task, prerequisites, attempts)
