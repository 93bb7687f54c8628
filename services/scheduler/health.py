"""What the scheduler says of itself (`shared/runtime/health.py`): whether PostgreSQL answers
(without it, it can do nothing: unavailable), whether its broker connection is up and Redis
answers (degraded while away: the outbox keeps what the relay cannot publish), and whether it
leads (a fact: a standby is healthy)."""

import asyncio

from redis.asyncio import Redis

from services.scheduler.leader import Leadership
from shared.messaging import redis_client
from shared.messaging.amqp import Broker
from shared.runtime.health import Check, Probe
from shared.store import db
from shared.store.db import Pool


def leading(held: bool, database: Check) -> Check:
    """Whether this scheduler holds the leader's lock (`Leadership.held`), in words."""
    if held:
        return Check(True, "leading")
    if database.ok:
        return Check(False, "standing by: another scheduler leads", "none")
    return Check(False, "not leading: PostgreSQL does not answer", "none")


def probe(pool: Pool, broker: Broker, redis: Redis, leadership: Leadership) -> Probe:
    """The scheduler's checks: `database`, `broker`, `redis`, `leading`."""

    async def checks() -> dict[str, Check]:
        database, cache = await asyncio.gather(db.health(pool), redis_client.health(redis))
        return {
            "database": database,
            "broker": broker.health(),
            "redis": cache,
            "leading": leading(leadership.held, database),
        }

    return checks
