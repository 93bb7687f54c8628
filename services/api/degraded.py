"""What `/healthz` reports as degraded: the api answers, but something it relies on
does not — no live worker or supervisor in the pool, every host quarantined, no scheduler
leading, events not going out, Redis away. Each reason says what is wrong, in words."""

from typing import Final

from redis.asyncio import Redis

from services.api import queries
from shared.messaging import redis_client
from shared.operations import pool_status
from shared.store.db import Connection

#: Events waiting longer than this to go out mean the relay is stuck (broker or scheduler).
STUCK_OUTBOX_S: Final = 30.0


async def reasons(conn: Connection, redis: Redis, pool: str, dead_host_s: float) -> list[str]:
    """Every reason the system is degraded now (empty: healthy)."""
    found = (await pool_status.read(conn, pool, dead_host_s)).troubles()
    if not await queries.scheduler_leading(conn):
        found.append("no scheduler is leading: nothing is released, ended or relayed")
    age = await queries.outbox_oldest_age(conn)
    if age is not None and age > STUCK_OUTBOX_S:
        found.append(
            f"events wait {age:.0f} s to be published: is RabbitMQ reachable by the scheduler?"
        )
    if not (await redis_client.health(redis)).ok:
        found.append("reconnecting to Redis: rate limits and live process notes are off")
    return found
