"""Tasks whose worker died: their process trees are killed and they are declared `lost`."""

import logging
import signal

from shared.host.cgroups import Cgroups
from shared.host.processes import signal_tree
from shared.operations import loss
from shared.store import tasks_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)


async def reap_worker(
    pool: Pool,
    host_id: str,
    instance: str,
    why: str,
    cgroups: Cgroups | None,
    since: float | None = None,
) -> int:
    """Kill what the dead worker `instance` left running on this host and fail its tasks.

    Returns how many tasks were declared lost. Idempotent: tasks already moved are skipped.
    """
    lost = 0
    async with pool.acquire() as conn:
        for task in await tasks_repo.held_by(conn, instance):
            if task.host != host_id:
                continue
            reaped = task.pid is None
            if task.pid is not None and task.pid_create_time is not None:
                cgroup = cgroups.path(task.id, task.claim) if cgroups and task.claim else None
                killed = signal_tree(task.pid, task.pid_create_time, cgroup, signal.SIGKILL)
                logger.info("task %s: process tree %d killed=%s", task.id, task.pid, killed)
                reaped = True
            lost += await loss.declare(conn, task, why=why, reaped=reaped, since=since)
    return lost


async def stale_instances(pool: Pool, host_id: str, live_instance: str | None) -> list[str]:
    """Worker instances that still hold tasks on this host but are not the live worker."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT DISTINCT worker FROM tasks WHERE host = $1 AND worker IS NOT NULL"
            " AND worker IS DISTINCT FROM $2",
            host_id,
            live_instance,
        )
    return [r["worker"] for r in rows]
