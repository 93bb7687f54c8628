"""Noticing dead hosts: when neither the worker nor the supervisor of a host heartbeats any more,
the tasks its worker held are lost. (A silent worker whose supervisor lives is the supervisor's
to judge: it can also kill the worker's processes.)"""

import logging

from shared.operations import loss
from shared.store import hosts_repo, tasks_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)


class Reaper:
    """Declares `lost` every task held by the worker of a host whose worker and supervisor
    heartbeats are both older than `dead_after_s`."""

    def __init__(self, pool: Pool, dead_after_s: float) -> None:
        self._pool, self._dead_after_s = pool, dead_after_s

    async def run_once(self) -> int:
        """Handle every dead host once; returns how many tasks were declared lost."""
        lost = 0
        async with self._pool.acquire() as conn:
            dead = await conn.fetch(
                "SELECT id, worker FROM hosts WHERE worker IS NOT NULL"
                " AND heartbeat_at < now() - make_interval(secs => $1)"
                " AND (supervisor_heartbeat_at IS NULL"
                "      OR supervisor_heartbeat_at < now() - make_interval(secs => $1))",
                self._dead_after_s,
            )
            for host in dead:
                why = f"host {host['id']} stopped heartbeating"
                for task in await tasks_repo.held_by(conn, host["worker"]):
                    lost += await loss.declare(conn, task, why=why)
                await hosts_repo.forget_worker(conn, host["id"], host["worker"])
                logger.warning("host %s is dead", host["id"], extra={"host": host["id"]})
        return lost
