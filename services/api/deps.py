"""Dependencies of the routes, as `Annotated` aliases: resources from `app.state`, the caller,
and path ids validated before they reach any SQL.
"""

from collections.abc import Mapping
from typing import Annotated, cast

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.api.errors import invalid
from services.api.metrics import Metrics
from services.api.settings import ApiSettings
from shared import users_repo
from shared.db import Pool
from shared.ids import is_safe_id
from shared.task_types.base import TaskType
from shared.users_repo import User

_bearer = HTTPBearer(auto_error=False, description="A token given to a user or operator.")


def _pool(request: Request) -> Pool:
    return cast(Pool, request.app.state.pool)


def _settings(request: Request) -> ApiSettings:
    return cast(ApiSettings, request.app.state.settings)


def _metrics(request: Request) -> Metrics:
    return cast(Metrics, request.app.state.metrics)


def _task_types(request: Request) -> Mapping[str, TaskType]:
    return cast(Mapping[str, TaskType], request.app.state.task_types)


PoolDep = Annotated[Pool, Depends(_pool)]
SettingsDep = Annotated[ApiSettings, Depends(_settings)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
TaskTypesDep = Annotated[Mapping[str, TaskType], Depends(_task_types)]


def _unauthorized() -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail="missing or invalid bearer token",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _current_user(
    pool: PoolDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    if credentials is None or not credentials.credentials:
        raise _unauthorized()
    async with pool.acquire() as conn:
        user = await users_repo.by_token(conn, credentials.credentials)
    if user is None:
        raise _unauthorized()
    return user


#: The user the bearer token belongs to; 401 (with `WWW-Authenticate: Bearer`) otherwise.
CurrentUser = Annotated[User, Depends(_current_user)]


def _job_id(job_id: Annotated[str, Path(description="A job id, e.g. `j-3k9x0q7mzt1a`.")]) -> str:
    if not is_safe_id(job_id):
        raise invalid(("path", "job_id"), f"job id {job_id[:100]!r} is not a valid id")
    return job_id


def _task_id(task_id: Annotated[str, Path(description="A task id, e.g. `t-3k9x0q7mzt1a`.")]) -> str:
    if not is_safe_id(task_id):
        raise invalid(("path", "task_id"), f"task id {task_id[:100]!r} is not a valid id")
    return task_id


#: A `{job_id}` path segment that is a well-formed id (422 naming it otherwise).
JobIdPath = Annotated[str, Depends(_job_id)]
#: A `{task_id}` path segment that is a well-formed id (422 naming it otherwise).
TaskIdPath = Annotated[str, Depends(_task_id)]
