"""The supervisor's own heartbeat in `hosts`: a host is dead only when both of its services
are silent (the scheduler's reaper), since a live supervisor judges its worker itself.

The beat reads, in the same statement, what the supervisor's other rounds need to know of
its host (`hosts_repo.SupervisorBeat`): whether its worker is silent (the worker
watch), and whether any command runs here, any task is held by a gone instance, or any kill
is owed (the reconcile looks further only where one is). An idle host costs one statement a
beat."""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from shared.domain.errors import UNAVAILABLE
from shared.host.beats import ThroughRedis, through_redis
from shared.host.fence import Lease
from shared.messaging.beat_board import Kind
from shared.runtime.lifecycle import wait_or_stop
from shared.store import hosts_repo
from shared.store.db import Pool
from shared.store.hosts_repo import SupervisorBeat

logger = logging.getLogger(__name__)


@dataclass
class LastBeat:
    """What the latest beat read of the host (before the first: `SupervisorBeat.unknown`)."""

    beat: SupervisorBeat = field(default_factory=SupervisorBeat.unknown)


async def beat(pool: Pool, host_id: str, instance: str, dead_worker_s: float) -> SupervisorBeat:
    """Record that this supervisor is alive (creates the host's row if no worker did yet)."""
    async with pool.acquire() as conn:
        return await hosts_repo.beat_supervisor(conn, host_id, instance, dead_worker_s)


async def heartbeat(
    pool: Pool,
    host_id: str,
    instance: str,
    every_s: float,
    stop: asyncio.Event,
    lease: Lease,
    dead_worker_s: float,
    last: LastBeat,
    via: ThroughRedis | None = None,
) -> None:
    """Beat every `every_s` until `stop`, renewing `lease` with each beat that lands and
    keeping what it read in `last`; errors are logged, not fatal (the lease then ages: see
    `shared/host/fence.py`). Through Redis (`via`, `shared/host/beats.py`), a beat lands once
    the leading scheduler has written it; one it has not answered goes to PostgreSQL."""
    while True:
        if not await _through_redis(via, pool, host_id, instance, dead_worker_s, lease, last):
            await _beat_itself(pool, host_id, instance, every_s, dead_worker_s, lease, last, via)
        if await wait_or_stop(stop, every_s):
            return


async def _through_redis(
    via: ThroughRedis | None,
    pool: Pool,
    host_id: str,
    instance: str,
    dead_worker_s: float,
    lease: Lease,
    last: LastBeat,
) -> bool:
    """Whether a beat through Redis was answered (the lease renewed, `last` told)."""
    if via is None:
        return False
    who = (Kind.SUPERVISOR, host_id, instance)
    answered = await through_redis(via, pool, who, _supervisor_beat, dead_worker_s)
    if answered is None:
        return False
    sent_at, last.beat = answered
    lease.renew(sent_at)
    return True


def _supervisor_beat(read: list[Any]) -> SupervisorBeat:
    worker, worker_silent, running, stale_holders, kills_owed = read
    return SupervisorBeat(
        None if worker is None else str(worker),
        bool(worker_silent),
        bool(running),
        bool(stale_holders),
        bool(kills_owed),
    )


async def _beat_itself(
    pool: Pool,
    host_id: str,
    instance: str,
    every_s: float,
    dead_worker_s: float,
    lease: Lease,
    last: LastBeat,
    via: ThroughRedis | None,
) -> None:
    sent_at = time.monotonic()
    try:
        async with asyncio.timeout(every_s * 5):
            last.beat = await beat(pool, host_id, instance, dead_worker_s)
    except (*UNAVAILABLE, TimeoutError) as exc:
        logger.warning("heartbeat failed: %s", exc or "timed out")
        last.beat = SupervisorBeat.unknown()  # the rounds look at everything meanwhile
    else:
        lease.renew(sent_at)
        if via is not None:
            via.book.reached(sent_at)
