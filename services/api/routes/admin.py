"""`/admin/*` (operators only): the emergency stop and its resume (design §8, §9); users and
their tokens (made, listed, revoked, disabled)."""

import logging
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, status

from services.api.deps import AUTH_RESPONSES, CredentialsDep, OperatorUser, PoolDep, SettingsDep
from services.api.schemas.admin import (
    TOKEN_ID_PATTERN,
    EmergencyResumePublic,
    EmergencyStatus,
    EmergencyStopPublic,
    EmergencyStopRequest,
    IssuedToken,
    NewToken,
    NewUser,
    TokenPublic,
    UserEdit,
    UserPublic,
)
from shared.domain.errors import Conflict
from shared.operations import emergency
from shared.store import quota_repo, users_repo

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


UserName = Annotated[
    str, Path(pattern=users_repo.NAME_PATTERN, description="A user's name, e.g. `alice`.")
]
_NO_USER: Final[dict[int | str, dict[str, Any]]] = {404: {"description": "No such user."}}


@router.get("/users", responses=_OPERATORS)
async def list_users(user: OperatorUser, pool: PoolDep, settings: SettingsDep) -> list[UserPublic]:
    """Every user by name: role, live tokens, creation, disabled or not, fair share and
    decayed usage, stored bytes and quota."""
    async with pool.acquire() as conn:
        found = await users_repo.list_users(conn)
    return [UserPublic.of(one, settings.store_quota_bytes) for one in found]


@router.patch("/users/{user_name}", responses=_OPERATORS | _NO_USER)
async def edit_user(
    user: OperatorUser, user_name: UserName, body: UserEdit, pool: PoolDep, settings: SettingsDep
) -> UserPublic:
    """Set a user's fair `share` (more than 0, at most 1,000,000): the scheduler's next round
    serves users in proportion to their shares; and/or their own quota of stored bytes,
    `store_quota_bytes` (0: none; null: the installation's again). 200 with the user."""
    async with pool.acquire() as conn, conn.transaction():
        if body.share is not None:
            await users_repo.set_share(conn, user_name, body.share)
        if "store_quota_bytes" in body.model_fields_set:
            await quota_repo.set_limit(conn, user_name, body.store_quota_bytes)
        [found] = await users_repo.list_users(conn, user_name)
    changed = body.model_dump(include=body.model_fields_set)
    logger.info("user %s set %s by %s", user_name, changed, user.name, extra={"user": user.name})
    return UserPublic.of(found, settings.store_quota_bytes)


@router.post(
    "/users",
    status_code=status.HTTP_201_CREATED,
    responses=_OPERATORS | {409: {"description": "A user of that name exists."}},
)
async def create_user(user: OperatorUser, body: NewUser, pool: PoolDep) -> IssuedToken:
    """Create a user with a first token: 201 with the token, shown this once."""
    token = users_repo.new_token()
    async with pool.acquire() as conn, conn.transaction():
        await users_repo.create_user(conn, body.name, body.role)
        issued = await users_repo.add_token(conn, body.name, token, body.label)
    logger.info("user %s created by %s", body.name, user.name, extra={"user": user.name})
    return IssuedToken(token=token, details=TokenPublic.of(issued))


@router.get("/users/{user_name}/tokens", responses=_OPERATORS | _NO_USER)
async def list_tokens(user: OperatorUser, user_name: UserName, pool: PoolDep) -> list[TokenPublic]:
    """A user's tokens, oldest first, revoked ones included (ids and labels, never a token)."""
    async with pool.acquire() as conn:
        return [TokenPublic.of(token) for token in await users_repo.list_tokens(conn, user_name)]


@router.post(
    "/users/{user_name}/tokens",
    status_code=status.HTTP_201_CREATED,
    responses=_OPERATORS | _NO_USER,
)
async def create_token(
    user: OperatorUser, user_name: UserName, body: NewToken, pool: PoolDep
) -> IssuedToken:
    """One more token for a user (their others stay valid): 201 with it, shown this once."""
    token = users_repo.new_token()
    async with pool.acquire() as conn:
        issued = await users_repo.add_token(conn, user_name, token, body.label)
    logger.info(
        "token %s made for %s by %s", issued.id, user_name, user.name, extra={"user": user.name}
    )
    return IssuedToken(token=token, details=TokenPublic.of(issued))


@router.post(
    "/users/{user_name}/disable",
    responses=_OPERATORS
    | _NO_USER
    | {409: {"description": "Operators cannot disable themselves."}},
)
async def disable_user(
    user: OperatorUser,
    user_name: UserName,
    pool: PoolDep,
    credentials: CredentialsDep,
    settings: SettingsDep,
) -> UserPublic:
    """Disable a user: none of their tokens works any more, at once (an open event stream ends
    within a second). Their jobs are left as they are. Idempotent."""
    if user_name == user.name:
        raise Conflict("an operator cannot disable themselves", next_step="ask another operator to")
    async with pool.acquire() as conn:
        found = await users_repo.disable_user(conn, user_name)
    credentials.forget()  # here at once; the other apis when the change's notification comes
    logger.info("user %s disabled by %s", user_name, user.name, extra={"user": user.name})
    return UserPublic.of(found, settings.store_quota_bytes)


@router.delete(
    "/tokens/{token_id}", responses=_OPERATORS | {404: {"description": "No such token."}}
)
async def revoke_token(
    user: OperatorUser,
    token_id: Annotated[str, Path(pattern=TOKEN_ID_PATTERN, description="`k-` and 12 hex digits.")],
    pool: PoolDep,
    credentials: CredentialsDep,
) -> TokenPublic:
    """Revoke a token: it stops working at once (an open event stream ends within a second).
    Idempotent: a revoked token keeps its first revocation time."""
    async with pool.acquire() as conn:
        token = await users_repo.revoke_token(conn, token_id)
    credentials.forget()  # here at once; the other apis when the change's notification comes
    logger.info(
        "token %s of %s revoked by %s", token.id, token.user, user.name, extra={"user": user.name}
    )
    return TokenPublic.of(token)
