"""Noticing dead hosts: when neither the worker nor the supervisor of a host heartbeats any more,
or when the batch system reported the allocation of a pilot's host ended (its processes went
with it: nothing is waited for), the tasks its worker held are lost. (A silent worker whose
supervisor lives is the supervisor's to judge: it can also kill the worker's processes.)"""

import logging
from typing import Final

from shared.operations import loss
from shared.store import hosts_repo, pilots_repo, tasks_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)

#: The hosts with a worker registered that are dead: silent (worker and supervisor) for $1
#: seconds, or a pilot's whose allocation the batch system reported ended.
_DEAD: Final = f"""
SELECT h.id, h.worker, {pilots_repo.allocation_ended("h.id")} AS ended FROM hosts h
WHERE h.worker IS NOT NULL AND (
    (h.heartbeat_at < now() - make_interval(secs => $1)
     AND (h.supervisor_heartbeat_at IS NULL
          OR h.supervisor_heartbeat_at < now() - make_interval(secs => $1)))
    OR {pilots_repo.allocation_ended("h.id")})
"""


class Reaper:
    """Declares `lost` every task held by the worker of a host whose worker and supervisor
    heartbeats are both older than `dead_after_s`, or whose pilot's allocation ended."""

    def __init__(self, pool: Pool, dead_after_s: float) -> None:
        self._pool, self._dead_after_s = pool, dead_after_s

    async def run_once(self) -> int:
        """Handle every dead host once; returns how many tasks were declared lost."""
        lost = 0
        async with self._pool.acquire() as conn:
            dead = await conn.fetch(_DEAD, self._dead_after_s)
            for host in dead:
                why = (
                    f"host {host['id']}: its batch allocation ended"
                    if host["ended"]
                    else f"host {host['id']} stopped heartbeating"
                )
                lost += await loss.declare_all(
                    conn, await tasks_repo.held_by(conn, host["worker"]), why
                )
                await hosts_repo.forget_worker(conn, host["id"], host["worker"])
                logger.warning("host %s is dead", host["id"], extra={"host": host["id"]})
        return lost
