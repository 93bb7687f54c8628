"""How the api answers errors it did not expect from the request: lost races are 409s."""

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

from services.api import errors


def _app(raised: Exception) -> FastAPI:
    app = FastAPI()
    errors.install(app)

    @app.post("/act")
    async def act() -> None:
        raise raised

    return app


@pytest.mark.parametrize(
    "raised",
    [asyncpg.DeadlockDetectedError("deadlock detected"), asyncpg.SerializationError("could not")],
)
async def test_a_transaction_postgresql_aborted_for_a_concurrent_one_is_a_409(
    raised: Exception,
) -> None:
    transport = httpx.ASGITransport(app=_app(raised))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        response = await client.post("/act")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "a concurrent change got in the way and nothing was done; try again",
        "next_step": "try again",
    }
