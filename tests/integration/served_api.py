"""The api served by uvicorn on a loopback port, in the test's event loop (holds no tests).

Server-Sent Events need a real HTTP server: httpx's ASGI transport buffers whole responses.
`served_api()` runs the app with its lifespan, and gives its base URL, the app (for its event
hub) and three callers, as `running_api()` does for the in-process client.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aio_pika
import httpx
import uvicorn
from fastapi import FastAPI

from services.api.app import create_app
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from shared.messaging.topology import Topology
from shared.store import db, users_repo
from tests.conftest import AMQP_URL, REDIS_URL
from tests.integration.test_api_harness import Caller, _bearer, _plain_user

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5


@dataclass(frozen=True)
class Served:
    """A served api: where it listens, its app and who may call it."""

    base_url: str
    app: FastAPI
    settings: ApiSettings
    operator: Caller
    user: Caller
    other: Caller

    @property
    def pool(self) -> db.Pool:
        pool: db.Pool = self.app.state.pool
        return pool

    @property
    def hub(self) -> EventHub:
        hub: EventHub = self.app.state.events
        return hub

    def client(self, caller: Caller | None = None, **options: Any) -> httpx.AsyncClient:
        """A client of the served api, signed as `caller` (anonymous when None)."""
        headers = caller.headers if caller else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=10, **options)

    async def submit(self, caller: Caller, **body: Any) -> str:
        """Submit a job as `caller` (201 asserted); its id."""
        body.setdefault("command", "echo hello")
        async with self.client(caller) as client:
            response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


@asynccontextmanager
async def served_api(database_url: str, namespace: str, **overrides: Any) -> AsyncIterator[Served]:
    """The api on `database_url` and `namespace`, listening on a free loopback port."""
    token = uuid.uuid4().hex
    values: dict[str, Any] = {
        "database_url": database_url,
        "amqp_url": AMQP_URL,
        "redis_url": REDIS_URL,
        "namespace": namespace,
        "bootstrap_token": token,
        "graceful_timeout_s": 2.0,
    }
    settings = ApiSettings(**(values | overrides))
    app = create_app(settings)
    # A bounded shutdown: a connection a failed test left open must not hang its teardown.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=STOP_TIMEOUT_S,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(), name="uvicorn")
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while not server.started:
                if serving.done():
                    serving.result()  # raises the startup error
                    raise RuntimeError("uvicorn stopped before it started")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        pool: db.Pool = app.state.pool
        async with pool.acquire() as conn:
            operator = await users_repo.by_token(conn, token)
        assert operator is not None
        yield Served(
            base_url=f"http://127.0.0.1:{port}",
            app=app,
            settings=settings,
            operator=Caller(operator, _bearer(token)),
            user=await _plain_user(pool),
            other=await _plain_user(pool),
        )
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(3 * STOP_TIMEOUT_S):
                await serving
        except TimeoutError:
            raise AssertionError(
                f"the served api did not stop within {3 * STOP_TIMEOUT_S} s"
            ) from None
        await _delete_events_exchange(namespace)


async def _delete_events_exchange(namespace: str) -> None:
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        channel = await connection.channel()
        await channel.exchange_delete(Topology(namespace).events_exchange)
    finally:
        await connection.close()
