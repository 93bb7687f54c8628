"""`create_app(settings)`: the FastAPI application, its lifespan and its routes.

The lifespan opens the database pool and a Redis client, refuses to start on an out-of-date
schema and makes the bootstrap operator; nothing is created at import.
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from fastapi import FastAPI

from services.api import credentials, errors
from services.api.body_limit import BodyLimit
from services.api.command_check import SyntaxCheck
from services.api.event_hub import EventHub
from services.api.metrics import Metrics
from services.api.rate_limit import SubmitLimiter, TaskQuota
from services.api.routes import (
    admin,
    bulk,
    events,
    health,
    hosts,
    jobs,
    outputs,
    pages,
    pilots,
    tasks,
    uploads,
)
from services.api.settings import ApiSettings
from shared.domain import analysers
from shared.domain.errors import SchemaOutOfDate
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology
from shared.objects import open_store
from shared.store import db, users_repo
from shared.task_types.registry import load_task_types

logger = logging.getLogger(__name__)

#: Name of the operator whose token is `VIGIL_BOOTSTRAP_TOKEN`.
BOOTSTRAP_OPERATOR: Final = "operator"

_DESCRIPTION: Final = """
Submit batch jobs, watch their tasks and read their logs.

Every route but `/healthz` needs `Authorization: Bearer <token>`; a missing or bad token is a
401. Jobs of other users answer 404. Invalid input answers 422 with `{"detail": [{loc, msg,
type}]}` naming the field; a body larger than `VIGIL_MAX_BODY_BYTES` answers 413.
"""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ApiSettings = app.state.settings
    async with (
        db.open_pool(settings.database_url, wait=True) as pool,
        # Not checked at start: the api serves without Redis (rate limits are then not applied).
        open_redis(settings.redis_url, check=False) as redis,
        credentials.listening(settings.database_url) as known_tokens,
    ):
        try:
            await db.check_schema(pool)
        except SchemaOutOfDate as exc:
            logger.error("refusing to start: %s", exc)
            raise
        if settings.bootstrap_token:
            async with pool.acquire() as conn:
                await users_repo.ensure_user(
                    conn, BOOTSTRAP_OPERATOR, "operator", settings.bootstrap_token
                )
        app.state.pool = pool
        app.state.object_store = open_store(settings.store_url, settings.s3_endpoint_url)
        app.state.credentials = known_tokens
        app.state.redis = redis
        app.state.limiter = SubmitLimiter(
            redis, app.state.redis_keys, settings.submit_rate_per_s, settings.submit_burst
        )
        app.state.task_quota = TaskQuota(
            redis, app.state.redis_keys, settings.task_rate_per_s, settings.task_burst
        )
        logger.info("api ready", extra={"action": "start"})
        try:
            yield
        finally:
            await app.state.events.close()  # ends every live event stream
            await app.state.object_store.close()
        logger.info("api stopping: closing the database pool", extra={"action": "stop"})


def create_app(settings: ApiSettings) -> FastAPI:
    """The api for `settings`; resources are opened by its lifespan, not here."""
    app = FastAPI(title="Vigil", version="1", description=_DESCRIPTION, lifespan=_lifespan)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.redis_keys = RedisKeys(settings.namespace)
    # Loaded here, not at import: a broken plugin stops the api at start, not at a submission.
    app.state.task_types = load_task_types()
    app.state.analysers = frozenset(analysers.available_names())
    app.state.syntax_check = SyntaxCheck()  # `bash -n` on submitted shell commands
    # One broker connection per api process for every live event stream, opened on first use.
    app.state.events = EventHub(
        settings.amqp_url,
        Topology(settings.namespace),
        settings.max_event_streams,
        per_holder=settings.max_event_streams_per_user,
    )
    errors.install(app)
    for module in (health, jobs, tasks, admin, events, hosts, pilots, bulk, outputs, uploads):
        app.include_router(module.router)
    pages.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
