"""The fleet as `GET /hosts` and the dashboard show it: one row per host, from PostgreSQL and Redis.

A pilot's host whose allocation has ended is not listed (the pilots list keeps the pilot, with
why it ended), nor a host an operator removed. PostgreSQL's `hosts` rows give slots, the
worker's and the supervisor's heartbeats and the quarantine; running tasks are counted from
`tasks.host` over the in-flight states; capacity and what is free from what the host's tasks
hold (`shared.store.pool_repo.loads`); Redis says whether the worker is registered now (its
presence hash, `shared.messaging.presence`, expires a few seconds after its last heartbeat).
Ages are measured by the database's clock, the one that stamped the heartbeats.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from asyncpg import Record
from redis.asyncio import Redis

from shared.domain.errors import UNAVAILABLE
from shared.domain.scheduling.resources import NOTHING, Resources
from shared.domain.states import IN_FLIGHT
from shared.messaging.redis_keys import RedisKeys
from shared.store import hosts_repo, pool_repo
from shared.store.db import Connection

logger = logging.getLogger(__name__)

#: Most hosts listed (a fleet is far smaller; the bound keeps the query bounded anyway).
MAX_HOSTS: Final = 1000

_HOSTS_SQL: Final = (
    "SELECT id, slots, worker, started_at, quarantined, quarantined_until, quarantine_reason,"
    " pool, breaker, probing_since, draining,"
    " extract(epoch FROM now() - heartbeat_at)::float8 AS worker_age,"
    " extract(epoch FROM now() - supervisor_heartbeat_at)::float8 AS supervisor_age"
    f" FROM hosts WHERE {hosts_repo.in_fleet('hosts')} ORDER BY id LIMIT $1"
)
_RUNNING_SQL: Final = (
    "SELECT host, count(*) AS n FROM tasks WHERE host = ANY($1::text[])"
    " AND state = ANY($2::task_state[]) GROUP BY host"
)


@dataclass(frozen=True)
class HostView:
    """One host: its worker and supervisor heartbeats, load and quarantine."""

    id: str
    slots: int
    worker: str | None
    worker_registered: bool | None  # None: Redis did not answer
    worker_heartbeat_age_s: float | None
    supervisor_heartbeat_age_s: float | None
    running_tasks: int
    quarantined: bool
    quarantined_until: datetime | None
    quarantine_reason: str | None
    started_at: datetime | None
    #: The pool its worker consumes (None: no worker registered since it was recorded).
    pool: str | None = None
    #: Quarantined by its breaker (probes its way back), not by an operator.
    breaker: bool = False
    #: Since when its breaker lets one task at a time through.
    probing_since: datetime | None = None
    #: An operator drains it: it finishes what it holds and takes no new task.
    draining: bool = False
    #: What its worker advertised it has (0 CPUs until it did), and what its tasks
    #: leave free: `{"cpus", "memory_mb", "gpus": [device ids]}`.
    capacity: dict[str, object] = field(default_factory=lambda: amount(NOTHING, ()))
    free: dict[str, object] = field(default_factory=lambda: amount(NOTHING, ()))


def amount(resources: Resources, gpu_ids: tuple[str, ...]) -> dict[str, object]:
    """An amount as `GET /hosts` shows it: CPUs, MiB, and the GPUs by device id."""
    return {
        "cpus": resources.millicpus / 1000,
        "memory_mb": resources.memory_mb,
        "gpus": list(gpu_ids),
    }


def _age(seconds: float | None) -> float | None:
    return None if seconds is None else round(max(seconds, 0.0), 3)


def view_of(
    row: Record, running: int, registered: bool | None, load: pool_repo.HostLoad | None = None
) -> HostView:
    """A host's view from its `hosts` row (with the ages) and the live facts."""
    capacity = amount(load.capacity, load.gpu_ids) if load else amount(NOTHING, ())
    free = amount(load.free, load.free_gpu_ids) if load else amount(NOTHING, ())
    return HostView(
        id=row["id"],
        slots=row["slots"],
        worker=row["worker"],
        worker_registered=registered,
        # A host without a worker has no worker heartbeat to age (the last one is history).
        worker_heartbeat_age_s=_age(row["worker_age"]) if row["worker"] else None,
        supervisor_heartbeat_age_s=_age(row["supervisor_age"]),
        running_tasks=running,
        quarantined=row["quarantined"],
        quarantined_until=row["quarantined_until"],
        quarantine_reason=row["quarantine_reason"],
        started_at=row["started_at"],
        pool=row["pool"],
        breaker=row["breaker"],
        probing_since=row["probing_since"],
        draining=row["draining"],
        capacity=capacity,
        free=free,
    )


async def list_hosts(conn: Connection, redis: Redis, keys: RedisKeys) -> list[HostView]:
    """Every known host, by id (at most `MAX_HOSTS`)."""
    rows = await conn.fetch(_HOSTS_SQL, MAX_HOSTS)
    ids = [row["id"] for row in rows]
    counts = await conn.fetch(_RUNNING_SQL, ids, sorted(s.value for s in IN_FLIGHT))
    running = {r["host"]: int(r["n"]) for r in counts}
    loads = await pool_repo.loads(conn, ids)
    present = await _registered(redis, keys, ids)
    return [
        view_of(row, running.get(row["id"], 0), present.get(row["id"]), loads.get(row["id"]))
        for row in rows
    ]


async def _registered(redis: Redis, keys: RedisKeys, ids: list[str]) -> dict[str, bool]:
    """Which hosts have a registered worker now; empty (unknown) when Redis does not answer."""
    pipe = redis.pipeline(transaction=False)
    for host_id in ids:
        pipe.exists(keys.worker(host_id))
    try:
        answers = await pipe.execute()
    except UNAVAILABLE as exc:
        logger.warning("cannot read worker presence from Redis: %s", exc)
        return {}
    return {host_id: bool(n) for host_id, n in zip(ids, answers, strict=True)}
