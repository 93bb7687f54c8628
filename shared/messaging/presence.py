"""The worker registration a host's supervisor follows: one Redis hash, written and read here.

The worker writes it when it starts (and refreshes its TTL); the supervisor reads it to hold a
pidfd on the worker process. Keeping both sides of the format in one place keeps them equal.
"""

from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from shared.messaging.redis_keys import WORKER_TTL_S, RedisKeys


@dataclass(frozen=True)
class WorkerIdentity:
    """A host's worker process: its instance id and its (pid, create time)."""

    instance: str
    pid: int
    create_time: float
    slots: int = 0


async def announce(redis: Redis, keys: RedisKeys, host_id: str, worker: WorkerIdentity) -> None:
    """Register `worker` as the worker of `host_id`, expiring unless refreshed."""
    fields = {
        "instance": worker.instance,
        "pid": str(worker.pid),
        "create_time": repr(worker.create_time),
        "slots": str(worker.slots),
    }
    key = keys.worker(host_id)
    await redis.hset(key, mapping=cast(Any, fields))  # redis-py's Mapping is invariant
    await redis.expire(key, WORKER_TTL_S)


async def registered(redis: Redis, keys: RedisKeys, host_id: str) -> WorkerIdentity | None:
    """The worker registered for `host_id`, or None (none, or an unreadable hash)."""
    fields = await redis.hgetall(keys.worker(host_id))
    try:
        return WorkerIdentity(
            str(fields["instance"]),
            int(fields["pid"]),
            float(fields["create_time"]),
            int(fields.get("slots", 0)),
        )
    except (KeyError, ValueError):
        return None


async def heartbeat_ages(redis: Redis, keys: RedisKeys, host_ids: list[str]) -> dict[str, float]:
    """Seconds since the last heartbeat of each registered worker among `host_ids`.

    Every heartbeat resets the registration's TTL to `WORKER_TTL_S`, so the age is what the TTL
    has lost. Hosts with no registration (expired: no heartbeat for `WORKER_TTL_S`) are left
    out. One round trip (a pipeline of PTTL).
    """
    pipe = redis.pipeline(transaction=False)
    for host_id in host_ids:
        pipe.pttl(keys.worker(host_id))
    remaining = await pipe.execute()
    return {
        host_id: max(WORKER_TTL_S - ms / 1000, 0.0)
        for host_id, ms in zip(host_ids, remaining, strict=True)
        if ms >= 0
    }
