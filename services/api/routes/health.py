"""`GET /healthz` (no auth) and `GET /metrics` (Prometheus text, auth)."""

import asyncio
import logging
from typing import Final

from fastapi import APIRouter, Request, Response, status
from prometheus_client import CONTENT_TYPE_LATEST

from services.api import degraded
from services.api.deps import (
    AUTH_RESPONSES,
    CurrentUser,
    MetricsDep,
    PoolDep,
    RedisDep,
    SettingsDep,
)
from services.api.event_hub import EventHub
from services.api.schemas.health import Health
from shared.domain.errors import UNAVAILABLE
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology
from shared.operations import pool_status

logger = logging.getLogger(__name__)

router = APIRouter(tags=["health"])

#: A database slower than this to answer `SELECT 1` counts as down.
HEALTH_TIMEOUT_S: Final = 2.0


@router.get(
    "/healthz",
    responses={503: {"model": Health, "description": "The database does not answer."}},
)
async def healthz(
    pool: PoolDep, redis: RedisDep, settings: SettingsDep, response: Response
) -> Health:
    """503 `unavailable` when the database does not answer; else 200, `ok`, or `degraded`
    with the reasons (no live worker or supervisor in the pool, every host quarantined, no
    scheduler leading, events not going out, Redis away). No token needed."""
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S), pool.acquire() as conn:
            found = await degraded.reasons(conn, redis, settings.worker_pool, settings.dead_host_s)
    except (*UNAVAILABLE, TimeoutError) as exc:
        logger.warning("health check failed: %s", exc)
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return Health(status="unavailable", reasons=["reconnecting to PostgreSQL"])
    return Health(status="degraded", reasons=found) if found else Health(status="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses=AUTH_RESPONSES
    | {200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."}},
)
async def metrics(
    user: CurrentUser,
    pool: PoolDep,
    redis: RedisDep,
    registry: MetricsDep,
    settings: SettingsDep,
    request: Request,
) -> Response:
    """The Prometheus text format: jobs and tasks per state, failed attempts per failure
    class, the outbox backlog and its age, the leading scheduler, the pool's hosts (live,
    open, probing), each host's heartbeat age and quarantine, the pool and dead-letter queue
    depths, detection latency, the emergency stop, and this process's submissions. Any valid
    token may read it."""
    keys: RedisKeys = request.app.state.redis_keys
    hub: EventHub = request.app.state.events
    topology = Topology(settings.namespace)
    names = {
        "pool": topology.pool_queue(settings.worker_pool),
        "dead_letters": topology.dead_letter_queue,
    }

    async def queues() -> dict[str, int]:
        depths = await hub.queue_depths(list(names.values()))
        return {label: depths[name] for label, name in names.items() if name in depths}

    async with pool.acquire() as conn:
        hosts = await pool_status.read(conn, settings.worker_pool, settings.dead_host_s)
        body = await registry.scrape(conn, redis, keys, hosts, queues)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
