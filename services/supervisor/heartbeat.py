"""The supervisor's own heartbeat in `hosts`: a host is dead only when both of its services
are silent (the scheduler's reaper), since a live supervisor judges its worker itself."""

import asyncio
import logging

from shared.db import Pool
from shared.errors import UNAVAILABLE
from shared.lifecycle import wait_or_stop

logger = logging.getLogger(__name__)


async def beat(pool: Pool, host_id: str, instance: str) -> None:
    """Record that this supervisor is alive (creates the host's row if no worker did yet)."""
    await pool.execute(
        "INSERT INTO hosts (id, slots, supervisor, supervisor_heartbeat_at)"
        " VALUES ($1, 0, $2, now()) ON CONFLICT (id) DO UPDATE"
        " SET supervisor = $2, supervisor_heartbeat_at = now()",
        host_id,
        instance,
    )


async def heartbeat(
    pool: Pool, host_id: str, instance: str, every_s: float, stop: asyncio.Event
) -> None:
    """Beat every `every_s` until `stop`; errors are logged, not fatal."""
    while True:
        try:
            await beat(pool, host_id, instance)
        except UNAVAILABLE as exc:
            logger.warning("heartbeat failed: %s", exc)
        if await wait_or_stop(stop, every_s):
            return
