"""The supervisor service: watch handed-over processes and the worker; reconcile; stop on SIGTERM.

Stopping the supervisor never stops the processes: a new supervisor re-attaches to them.
"""

import asyncio
import logging
import os
import secrets
import signal
from contextlib import AsyncExitStack

from aio_pika.abc import AbstractIncomingMessage
from redis.asyncio import Redis

from services.supervisor.error_logs import ErrorLogs
from services.supervisor.freezes import Suspensions
from services.supervisor.heartbeat import LastBeat, heartbeat
from services.supervisor.reconcile import reconcile
from services.supervisor.settings import SupervisorSettings
from services.supervisor.watchers import Watchers
from services.supervisor.worker_watch import WorkerWatch
from shared.domain.errors import UNAVAILABLE, InvalidMessage
from shared.domain.messages import FreezeTask, KillTask, Message, WatchProcess
from shared.host import fence, handovers
from shared.host import health as host_health
from shared.host.beats import through_redis_if
from shared.host.cgroups import Cgroups
from shared.host.fence import Lease
from shared.host.processes import signal_tree
from shared.messaging.amqp import Handler, deliver, open_broker
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology, declare_all_work_queues
from shared.runtime.health import Health
from shared.runtime.lifecycle import stop_on_signals, wait_or_stop
from shared.store import attempts_repo
from shared.store.db import Pool, check_schema, open_pool

logger = logging.getLogger(__name__)


async def _reconcile_loop(
    settings: SupervisorSettings,
    pool: Pool,
    redis: Redis,
    watchers: Watchers,
    cgroups: Cgroups | None,
    stop: asyncio.Event,
    last: LastBeat,
) -> None:
    keys = RedisKeys(settings.namespace)
    suspensions = Suspensions()
    while True:
        try:
            await reconcile(
                pool,
                redis,
                keys,
                watchers,
                settings.host_id,
                settings.namespace,
                cgroups,
                suspensions,
                last.beat,
            )
        except UNAVAILABLE as exc:
            logger.warning("reconcile failed, will retry: %s", exc)
        if await wait_or_stop(stop, settings.reconcile_s):
            return


def _follow(watchers: Watchers, message: WatchProcess) -> None:
    """Watch a handed-over process. A stale hand-over (the task ended, or runs under another
    claim) is found out by the watcher: its process is gone, or its load finds the task moved
    on."""
    watchers.watch(
        message.task_id,
        message.job_id,
        message.claim,
        message.pid,
        message.create_time,
        ran_s=message.ran_s,
    )


def _handler(pool: Pool, watchers: Watchers, cgroups: Cgroups | None) -> Handler:
    """Handles the host's supervisor queue: processes to watch, processes to kill."""

    async def handle(message: Message) -> None:
        if isinstance(message, KillTask):
            cgroup = (
                cgroups.path(message.task_id, message.claim) if cgroups and message.claim else None
            )
            killed = signal_tree(message.pid, message.create_time, cgroup, signal.SIGKILL)
            logger.info("task %s: %s (killed=%s)", message.task_id, message.reason, killed)
            async with pool.acquire() as conn:
                await attempts_repo.mark_reaped(conn, message.task_id, message.pid)
            return
        if isinstance(message, FreezeTask):
            cgroup = (
                cgroups.path(message.task_id, message.claim) if cgroups and message.claim else None
            )
            sig = signal.SIGSTOP if message.frozen else signal.SIGCONT
            signal_tree(message.pid, message.create_time, cgroup, sig)
            logger.info(
                "task %s: %s", message.task_id, "stopped" if message.frozen else "continued"
            )
            return
        if not isinstance(message, WatchProcess):
            raise InvalidMessage(f"a supervisor cannot handle {message.type}")
        _follow(watchers, message)  # a worker of an earlier version's hand-over

    return handle


async def main(settings: SupervisorSettings) -> None:
    """Run until SIGTERM."""
    topology = Topology(settings.namespace)
    health = Health("supervisor")
    async with stop_on_signals() as stop, AsyncExitStack() as stack:
        await stack.enter_async_context(
            health.serve(settings.health_host, settings.supervisor_health_port)
        )
        health.starting("connecting to PostgreSQL")
        pool = await stack.enter_async_context(open_pool(settings.database_url, wait=True))
        await check_schema(pool)
        health.starting("connecting to RabbitMQ")
        broker = await stack.enter_async_context(
            open_broker(settings.amqp_url, topology, f"supervisor-{settings.host_id}")
        )
        health.starting("connecting to Redis")
        redis = await stack.enter_async_context(open_redis(settings.redis_url))
        health.starting("consuming its queues")
        instance = f"{settings.host_id}-{os.getpid()}-{secrets.token_hex(3)}"
        cgroups = Cgroups.detect(settings.namespace, settings.cgroup_root)
        error_logs = ErrorLogs()
        watchers = Watchers(
            pool,
            redis,
            RedisKeys(settings.namespace),
            settings.watch(),
            cgroups,
            error_logs,
        )
        stack.push_async_callback(watchers.close)
        await error_logs.start(
            broker, topology.error_log_queue(settings.host_id, instance), watchers.on_log
        )
        channel = await broker.channel_for_consuming(prefetch=256)
        _, _, queue = await declare_all_work_queues(channel, topology, settings.host_id)
        handler = _handler(pool, watchers, cgroups)

        async def on_message(incoming: AbstractIncomingMessage) -> None:
            await deliver(incoming, handler)

        tag = await queue.consume(on_message)
        last = LastBeat()
        worker_watch = WorkerWatch(
            pool,
            redis,
            RedisKeys(settings.namespace),
            settings.host_id,
            cgroups,
            settings.dead_worker_s,
            last,
        )
        logger.info(
            "supervising host %s (%s)",
            settings.host_id,
            f"cgroups under {cgroups.root}" if cgroups else "process groups only",
        )
        lease = Lease()
        watched = lambda: {"worker": worker_watch.health()}  # noqa: E731
        health.up(host_health.probe(settings, lease, broker, redis, watched))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                heartbeat(
                    pool,
                    settings.host_id,
                    instance,
                    settings.heartbeat_s,
                    stop,
                    lease,
                    settings.dead_worker_s,
                    last,
                    through_redis_if(
                        settings.beats_through_redis,
                        redis,
                        RedisKeys(settings.namespace),
                        settings.dead_host_s,
                    ),
                ),
                name="heartbeat",
            )
            tg.create_task(
                fence.guard_host(lease, settings, cgroups, stop),
                name="fence",
            )
            tg.create_task(worker_watch.run(stop, settings.worker_poll_s), name="worker-watch")
            tg.create_task(
                handovers.follow(
                    redis,
                    [RedisKeys(settings.namespace).handovers(settings.host_id)],
                    lambda watch: _follow(watchers, watch),
                    stop,
                ),
                name="handovers",
            )
            tg.create_task(
                _reconcile_loop(settings, pool, redis, watchers, cgroups, stop, last),
                name="reconcile",
            )
        await queue.cancel(tag)
    logger.info("supervisor stopped")
