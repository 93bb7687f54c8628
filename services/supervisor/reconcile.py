"""Comparing PostgreSQL's view of this host with what runs on it.

On start and every `reconcile_s`: every `on_cpu` task of this host is watched (re-attached if
its process lives, judged at once if not), tasks held by a worker instance that is no longer
the registered one are reaped as orphans, stray processes (marked as a task's, but no
task runs them any more) are killed, and so is whatever still runs of a command whose attempt
someone else ended (a cancel, a task declared lost) without anyone seeing it gone: its kill is
owed whatever became of the `KillTask` sent for it (`owed_kills.py`); and each command is
stopped or continued as its job is suspended or not, whatever became of the `FreezeTask`
sent for it (`freezes.py`).
"""

import logging
import signal

from asyncpg import Record
from redis.asyncio import Redis

from services.supervisor import freezes
from services.supervisor.orphans import reap_worker, stale_instances
from services.supervisor.owed_kills import kill_owed
from services.supervisor.strays import kill_strays
from services.supervisor.watchers import Watchers
from shared.host import processes
from shared.host.cgroups import Cgroups
from shared.messaging.presence import registered
from shared.messaging.redis_keys import RedisKeys
from shared.store.db import Pool
from shared.store.hosts_repo import SupervisorBeat

logger = logging.getLogger(__name__)


async def reconcile(
    pool: Pool,
    redis: Redis,
    keys: RedisKeys,
    watchers: Watchers,
    host_id: str,
    namespace: str,
    cgroups: Cgroups | None,
    suspensions: freezes.Suspensions | None = None,
    seen: SupervisorBeat | None = None,
) -> None:
    """One comparison round (idempotent); `suspensions` carries what each command owed its
    job's suspension from one round to the next (None: nothing is stopped or continued).
    `seen`, what the supervisor's last beat read of the host, spares the reads that would
    find nothing (None: everything is read)."""
    seen = seen or SupervisorBeat.unknown()
    for row in await on_cpu_here(pool, host_id) if seen.running else []:
        if not watchers.is_watching(row["id"], row["claim"]):
            watchers.watch(
                row["id"], row["job_id"], row["claim"], row["pid"], row["pid_create_time"] or 0.0
            )
        if suspensions is not None:
            _keep_suspension(row, cgroups, suspensions)
    if suspensions is not None:
        suspensions.next_round()
    if seen.stale_holders:
        await reap_stale(pool, redis, keys, host_id, cgroups)
    await kill_strays(pool, namespace, host_id, cgroups)  # reads only for processes found
    if seen.kills_owed:
        await kill_owed(pool, namespace, host_id, cgroups)


def _keep_suspension(
    row: Record, cgroups: Cgroups | None, suspensions: freezes.Suspensions
) -> None:
    """Stop the command of a suspended job, continue that of a running one, when its
    `FreezeTask` was lost: the difference seen at two reconciles in a row (`freezes.py`)."""
    created = row["pid_create_time"] or 0.0
    sig = freezes.owed(row["suspended"], processes.run_state(row["pid"], created))
    if sig is None or not suspensions.confirmed(row["id"], row["claim"], sig):
        return
    cgroup = cgroups.path(row["id"], row["claim"]) if cgroups is not None else None
    if processes.signal_tree(row["pid"], created, cgroup, sig):
        logger.warning(
            "task %s: its job is %s but its command was %s: %s it now",
            row["id"],
            "suspended" if row["suspended"] else "running",
            "running" if row["suspended"] else "stopped",
            "stopped" if sig is signal.SIGSTOP else "continued",
            extra={"task_id": row["id"]},
        )


async def on_cpu_here(pool: Pool, host_id: str) -> list[Record]:
    """The tasks PostgreSQL says run a command on this host: id, job_id, claim, pid,
    pid_create_time, and whether their job is suspended."""
    async with pool.acquire() as conn:
        return await conn.fetch(
            "SELECT t.id, t.job_id, t.claim, t.pid, t.pid_create_time,"
            " j.state = 'suspended' AS suspended FROM tasks t JOIN jobs j ON j.id = t.job_id"
            " WHERE t.host = $1 AND t.state = 'on_cpu' AND t.claim IS NOT NULL"
            " AND t.pid IS NOT NULL",
            host_id,
        )


async def reap_stale(
    pool: Pool, redis: Redis, keys: RedisKeys, host_id: str, cgroups: Cgroups | None
) -> None:
    """Fail as lost the tasks still held by worker instances of this host that are not its
    registered one."""
    # Holders are read before the registration: a worker registers before it takes any task,
    # so a holder that is not the registration read afterwards is dead or replaced.
    holders = await stale_instances(pool, host_id, None)
    if not holders:
        return
    live = await registered(redis, keys, host_id)
    for instance in holders:
        if live is not None and instance == live.instance:
            continue
        why = f"worker {instance} is no longer running on host {host_id}"
        lost = await reap_worker(pool, host_id, instance, why, cgroups)
        if lost:
            logger.warning("reconcile: %d task(s) of gone worker %s lost", lost, instance)
