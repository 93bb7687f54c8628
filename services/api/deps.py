"""Dependencies of the routes, as `Annotated` aliases: resources from `app.state`, the caller,
and path ids validated before they reach any SQL.
"""

import logging
from collections.abc import Mapping
from typing import Annotated, Any, Final, cast

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis

from services.api import session
from services.api.command_check import SyntaxCheck
from services.api.credentials import Credentials
from services.api.errors import invalid
from services.api.event_hub import EventHub
from services.api.metrics import Metrics
from services.api.rate_limit import SubmitLimiter, TaskQuota
from services.api.settings import ApiSettings
from shared.domain.ids import is_safe_id
from shared.objects import ObjectStore
from shared.store.db import Pool
from shared.store.users_repo import User
from shared.task_types.base import TaskType

logger = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="A token given to a user or operator.")


async def _pool(request: Request) -> Pool:
    return cast(Pool, request.app.state.pool)


async def _settings(request: Request) -> ApiSettings:
    return cast(ApiSettings, request.app.state.settings)


async def _metrics(request: Request) -> Metrics:
    return cast(Metrics, request.app.state.metrics)


async def _task_types(request: Request) -> Mapping[str, TaskType]:
    return cast(Mapping[str, TaskType], request.app.state.task_types)


async def _event_hub(request: Request) -> EventHub:
    return cast(EventHub, request.app.state.events)


async def _redis(request: Request) -> Redis:
    return cast(Redis, request.app.state.redis)


async def _credentials(request: Request) -> Credentials:
    return cast(Credentials, request.app.state.credentials)


PoolDep = Annotated[Pool, Depends(_pool)]


async def _object_store(request: Request) -> ObjectStore:
    return cast(ObjectStore, request.app.state.object_store)


#: Where outputs are kept (`VIGIL_STORE_URL`).
ObjectStoreDep = Annotated[ObjectStore, Depends(_object_store)]
#: Whom tokens belong to, remembered while their changes are listened for.
CredentialsDep = Annotated[Credentials, Depends(_credentials)]
EventHubDep = Annotated[EventHub, Depends(_event_hub)]
RedisDep = Annotated[Redis, Depends(_redis)]
SettingsDep = Annotated[ApiSettings, Depends(_settings)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
TaskTypesDep = Annotated[Mapping[str, TaskType], Depends(_task_types)]


async def _analysers(request: Request) -> frozenset[str]:
    return cast(frozenset[str], request.app.state.analysers)


#: The names of the analysers a job may choose (`policy.analyser`).
AnalysersDep = Annotated[frozenset[str], Depends(_analysers)]


async def _syntax_check(request: Request) -> SyntaxCheck:
    return cast(SyntaxCheck, request.app.state.syntax_check)


#: `bash -n` on submitted shell commands (their verdicts remembered).
SyntaxCheckDep = Annotated[SyntaxCheck, Depends(_syntax_check)]


def _unauthorized() -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail="missing or invalid bearer token",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _current_user(
    request: Request,
    pool: PoolDep,
    known: CredentialsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    token = session.token_of(request, credentials.credentials if credentials else None)
    if token is None:
        raise _unauthorized()
    user = await known.holder(pool, token)
    if user is None:
        raise _unauthorized()
    request.state.token = token  # an open event stream looks it up again (revocation)
    return user


#: The user the bearer token (or the dashboard's session cookie) belongs to; 401 (with
#: `WWW-Authenticate: Bearer`) otherwise.
CurrentUser = Annotated[User, Depends(_current_user)]

#: For the OpenAPI schema: what every route that needs a token may answer (give it to the router).
AUTH_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    401: {"description": "Missing or invalid bearer token."}
}


async def _operator(user: CurrentUser) -> User:
    if not user.is_operator:
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail="operators only")
    return user


#: The caller, who must be an operator: 401 without a valid token, 403 for a plain user.
OperatorUser = Annotated[User, Depends(_operator)]


async def _limiter(request: Request) -> SubmitLimiter:
    return cast(SubmitLimiter, request.app.state.limiter)


async def _task_quota(request: Request) -> TaskQuota:
    return cast(TaskQuota, request.app.state.task_quota)


#: Charges the tasks a request creates to its user (`QuotaExceeded`: 429, or 413).
TaskQuotaDep = Annotated[TaskQuota, Depends(_task_quota)]
#: The answers of a route that charges tasks, for its OpenAPI description.
QUOTA_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    413: {"description": "It would create more tasks than a user may at once."},
    429: {
        "description": "It would create more tasks than the user may now;"
        " `Retry-After` says when to retry."
    },
}


async def _submission_allowed(
    request: Request,
    user: CurrentUser,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    limiter: Annotated[SubmitLimiter, Depends(_limiter)],
) -> User:
    if user.is_operator:  # trusted with bulk loads and benchmarks (they can stop everything)
        return user
    token = session.token_of(request, credentials.credentials if credentials else None)
    assert token is not None  # `user` was found by it
    refused = await limiter.take(token)
    if refused is not None:
        logger.info("submission refused: %s", refused.message, extra={"user": user.name})
        raise HTTPException(
            status_code=status.HTTP_429_TOO_MANY_REQUESTS,
            detail=refused.message,
            headers={"Retry-After": str(refused.retry_after_s)},
        )
    return user


#: The caller of a submission route, within their token's rate limit (429 otherwise); operators
#: are not limited.
SubmittingUser = Annotated[User, Depends(_submission_allowed)]


async def _job_id(
    job_id: Annotated[str, Path(description="A job id, e.g. `j-3k9x0q7mzt1a`.")],
) -> str:
    if not is_safe_id(job_id):
        raise invalid(("path", "job_id"), f"job id {job_id[:100]!r} is not a valid id")
    return job_id


async def _task_id(
    task_id: Annotated[str, Path(description="A task id, e.g. `t-3k9x0q7mzt1a`.")],
) -> str:
    if not is_safe_id(task_id):
        raise invalid(("path", "task_id"), f"task id {task_id[:100]!r} is not a valid id")
    return task_id


#: A `{job_id}` path segment that is a well-formed id (422 naming it otherwise).
JobIdPath = Annotated[str, Depends(_job_id)]
#: A `{task_id}` path segment that is a well-formed id (422 naming it otherwise).
TaskIdPath = Annotated[str, Depends(_task_id)]
