"""The worker's presence: a Redis hash the supervisor watches, and a heartbeat in `hosts`.

The Redis hash names the worker process (pid, create time, instance id) so that the host's
supervisor can watch it by pidfd; `hosts.heartbeat_at` lets the scheduler notice a dead host.
"""

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from services.worker.admission import Admission, of_host
from shared.domain.errors import UNAVAILABLE
from shared.host.beats import ThroughRedis, accept, send
from shared.host.capacity import HostCapacity
from shared.host.fence import Lease
from shared.host.processes import create_time
from shared.messaging.beat_board import Heard, Kind
from shared.messaging.presence import WorkerIdentity, announce
from shared.messaging.redis_keys import WORKER_TTL_S, RedisKeys
from shared.runtime.lifecycle import wait_or_stop
from shared.store import hosts_repo
from shared.store.db import Pool
from shared.store.hosts_repo import WorkerBeat

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Presence:
    """Who this worker is, and what its host has, as the supervisor and the scheduler see
    it."""

    host_id: str
    instance: str
    capacity: HostCapacity

    def identity(self) -> WorkerIdentity:
        pid = os.getpid()
        return WorkerIdentity(self.instance, pid, create_time(pid) or 0.0, self.capacity.slots)


async def register(
    pool: Pool, redis: Redis, keys: RedisKeys, presence: Presence, pool_name: str
) -> Admission:
    """Announce this worker (idempotent): Redis hash with a TTL, and the `hosts` row (with the
    worker pool it consumes and the host's capacity, by which the scheduler places tasks
    here). Returns what the host's quarantine lets it take."""
    await announce(redis, keys, presence.host_id, presence.identity())
    capacity = presence.capacity
    async with pool.acquire() as conn:
        row = await hosts_repo.register_worker(
            conn,
            presence.host_id,
            presence.instance,
            pool_name,
            capacity.resources,
            capacity.gpu_ids,
        )
    return of_host(row["quarantined"], row["probing"], row["draining"])


async def heartbeat(
    pool: Pool,
    redis: Redis,
    keys: RedisKeys,
    presence: Presence,
    every_s: float,
    stop: asyncio.Event,
    on_admission: Callable[[Admission], Awaitable[None]],
    lease: Lease,
    on_held: Callable[[int], None] | None = None,
    via: ThroughRedis | None = None,
    on_removed: Callable[[], None] | None = None,
) -> None:
    """Refresh the presence every `every_s` seconds until `stop`; errors are logged, not fatal.
    Each beat that lands in PostgreSQL renews `lease` (`shared/host/fence.py`): through Redis
    (`via`, `shared/host/beats.py`) once the leading scheduler has written it, else by itself.

    A worker that was silent long enough to be declared dead (frozen, partitioned) takes its
    place again when it wakes. `on_admission` is told what the host's quarantine lets it take,
    each time, and `on_held` how many tasks PostgreSQL says this instance holds (read by the
    beat's statement: a worker holding none has nothing to reconcile). A beat that finds the
    host removed by an operator (`shared/operations/host_removal.py`) lands nowhere: the
    worker is told by `on_removed`, at each such beat.
    """
    while not await wait_or_stop(stop, every_s):
        who = (Kind.WORKER, presence.host_id, presence.instance)
        heard = None if via is None else await send(via, who, registration_ttl_s=WORKER_TTL_S)
        await _refresh(redis, keys, presence, heard)
        if via is not None:
            answered = await accept(via, pool, heard, presence.instance, _worker_beat)
            if answered is not None:
                sent_at, beat = answered
                lease.renew(sent_at)
                await _heard(beat, on_admission, on_held)
                continue
        sent_at = time.monotonic()
        try:
            async with pool.acquire() as conn:
                row = await hosts_repo.beat_worker(conn, presence.host_id, presence.instance)
                removed = row is None and await hosts_repo.is_removed(conn, presence.host_id)
            if removed and on_removed is not None:
                on_removed()
            if row is not None:
                lease.renew(sent_at)
                if via is not None:
                    via.book.reached(sent_at)
                beat = WorkerBeat(row["quarantined"], row["probing"], row["draining"], row["held"])
                await _heard(beat, on_admission, on_held)
        except UNAVAILABLE as exc:
            logger.warning("heartbeat failed: %s", exc)


async def _refresh(redis: Redis, keys: RedisKeys, presence: Presence, heard: Heard | None) -> None:
    """The registration's TTL refreshed (by the beat through Redis, if it was `heard`), or the
    registration made again if it had expired."""
    try:
        if heard is not None:
            registered = heard.registered
        else:
            registered = bool(await redis.expire(keys.worker(presence.host_id), WORKER_TTL_S))
        if not registered:
            await announce(redis, keys, presence.host_id, presence.identity())
    except UNAVAILABLE as exc:  # Redis away is no partition from the database
        logger.warning("presence not refreshed in Redis: %s", exc)


def _worker_beat(read: list[Any]) -> WorkerBeat:
    quarantined, probing, draining, held = read
    return WorkerBeat(bool(quarantined), bool(probing), bool(draining), int(held))


async def _heard(
    beat: WorkerBeat,
    on_admission: Callable[[Admission], Awaitable[None]],
    on_held: Callable[[int], None] | None,
) -> None:
    if on_held is not None:
        on_held(beat.held)
    await on_admission(of_host(beat.quarantined, beat.probing, beat.draining))


async def unregister(pool: Pool, redis: Redis, keys: RedisKeys, presence: Presence) -> None:
    """Withdraw this worker after a graceful stop (only if it is still the registered one)."""
    key = keys.worker(presence.host_id)
    if await redis.hget(key, "instance") == presence.instance:
        await redis.delete(key)
    async with pool.acquire() as conn:
        await hosts_repo.forget_worker(conn, presence.host_id, presence.instance)
