"""What a worker or a supervisor says of itself (`shared/runtime/health.py`): from its lease,
whether PostgreSQL hears it and whether it has fenced itself (`shared/host/fence.py`); whether
its broker connection is up and Redis answers; and what only that service knows (`own`: the
worker's intake, the supervisor's worker)."""

from collections.abc import Callable

from redis.asyncio import Redis

from shared.host import fence
from shared.host.fence import Lease
from shared.messaging import redis_client
from shared.messaging.amqp import Broker
from shared.runtime.config import HostSettings
from shared.runtime.health import Check, Probe


def probe(
    settings: HostSettings,
    lease: Lease,
    broker: Broker,
    redis: Redis,
    own: Callable[[], dict[str, Check]],
) -> Probe:
    """The checks of a per-host service: `database` and `fence` (degraded, then unavailable,
    as its lease ages), `broker` and `redis` (degraded while away), then `own`."""

    async def checks() -> dict[str, Check]:
        return {
            **fence.health(lease, settings.heartbeat_s, settings.fence_timeout_s),
            "broker": broker.health(),
            "redis": await redis_client.health(redis),
            **own(),
        }

    return checks
