"""The supervisor's own heartbeat in `hosts`: a host is dead only when both of its services
are silent (the scheduler's reaper), since a live supervisor judges its worker itself."""

import asyncio
import logging
import time

from shared.domain.errors import UNAVAILABLE
from shared.host.fence import Lease
from shared.runtime.lifecycle import wait_or_stop
from shared.store import hosts_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)


async def beat(pool: Pool, host_id: str, instance: str) -> None:
    """Record that this supervisor is alive (creates the host's row if no worker did yet)."""
    async with pool.acquire() as conn:
        await hosts_repo.beat_supervisor(conn, host_id, instance)


async def heartbeat(
    pool: Pool, host_id: str, instance: str, every_s: float, stop: asyncio.Event, lease: Lease
) -> None:
    """Beat every `every_s` until `stop`, renewing `lease` with each beat that lands; errors
    are logged, not fatal (the lease then ages: see `shared/host/fence.py`)."""
    while True:
        sent_at = time.monotonic()
        try:
            async with asyncio.timeout(every_s * 5):
                await beat(pool, host_id, instance)
        except (*UNAVAILABLE, TimeoutError) as exc:
            logger.warning("heartbeat failed: %s", exc or "timed out")
        else:
            lease.renew(sent_at)
        if await wait_or_stop(stop, every_s):
            return
