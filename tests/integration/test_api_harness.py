"""An in-process api on the session database, for the `test_api_*` modules (holds no tests).

`running_api()` enters the app's lifespan itself (httpx's ASGITransport does not run it) and
gives three callers: the bootstrap operator, a user and another user, each with a fresh token.
"""

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.objects import ObjectStore
from shared.store import db, users_repo
from shared.store.users_repo import User


@dataclass(frozen=True)
class Caller:
    """A user of the api and the headers that authenticate them."""

    user: User
    headers: dict[str, str]


@dataclass(frozen=True)
class Api:
    """A running api and who may call it."""

    client: httpx.AsyncClient
    pool: db.Pool
    settings: ApiSettings
    operator: Caller
    user: Caller
    other: Caller
    #: Where its outputs are (`VIGIL_STORE_URL`: the default directory unless overridden).
    store: ObjectStore

    async def submit(self, caller: Caller, **body: Any) -> dict[str, Any]:
        """POST /jobs with `body` (a default command if none), asserting 201; the job view."""
        body.setdefault("command", "echo hello")
        response = await self.client.post("/jobs", json=body, headers=caller.headers)
        assert response.status_code == 201, response.text
        job: dict[str, Any] = response.json()
        return job

    async def jobs_of(self, caller: Caller) -> int:
        """How many jobs `caller` owns (to show that a refused request wrote nothing)."""
        count = await self.pool.fetchval(
            "SELECT count(*) FROM jobs WHERE owner_id = $1", caller.user.id
        )
        return int(count)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _plain_user(pool: db.Pool, role: users_repo.Role = "user") -> Caller:
    token = uuid.uuid4().hex
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"user-{uuid.uuid4().hex[:8]}", role, token)
    return Caller(user, _bearer(token))


@asynccontextmanager
async def running_api(database_url: str, **overrides: Any) -> AsyncIterator[Api]:
    """The api on `database_url` with small limits (override any setting by keyword)."""
    token = uuid.uuid4().hex
    values: dict[str, Any] = {
        "database_url": database_url,
        "bootstrap_token": token,
        "max_inputs": 5,
        "max_body_bytes": 200_000,
    }
    settings = ApiSettings(**(values | overrides))
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://api") as client,
    ):
        pool: db.Pool = app.state.pool
        async with pool.acquire() as conn:
            operator = await users_repo.by_token(conn, token)
        assert operator is not None and operator.is_operator
        yield Api(
            client=client,
            pool=pool,
            settings=settings,
            operator=Caller(operator, _bearer(token)),
            user=await _plain_user(pool),
            other=await _plain_user(pool),
            store=app.state.object_store,
        )
