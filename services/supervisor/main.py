"""The supervisor service: watch handed-over processes and the worker; reconcile; stop on SIGTERM.

Stopping the supervisor never stops the processes: a new supervisor re-attaches to them.
"""

import asyncio
import logging
from contextlib import AsyncExitStack

from aio_pika.abc import AbstractIncomingMessage
from redis.asyncio import Redis

from services.supervisor.reconcile import reconcile
from services.supervisor.settings import SupervisorSettings
from services.supervisor.watchers import Watchers
from services.supervisor.worker_watch import WorkerWatch
from shared import tasks_repo
from shared.amqp import Handler, deliver, open_broker
from shared.db import Pool, check_schema, open_pool
from shared.errors import UNAVAILABLE, InvalidMessage
from shared.lifecycle import stop_on_signals, wait_or_stop
from shared.messages import KillTask, Message, WatchProcess
from shared.processes import kill_group_of
from shared.redis_client import open_redis
from shared.redis_keys import RedisKeys
from shared.states import TaskState
from shared.topology import Topology, declare_all_work_queues

logger = logging.getLogger(__name__)


async def _reconcile_loop(
    settings: SupervisorSettings, pool: Pool, redis: Redis, watchers: Watchers, stop: asyncio.Event
) -> None:
    keys = RedisKeys(settings.namespace)
    while True:
        try:
            await reconcile(pool, redis, keys, watchers, settings.host_id)
        except UNAVAILABLE as exc:
            logger.warning("reconcile failed, will retry: %s", exc)
        if await wait_or_stop(stop, settings.reconcile_s):
            return


def _handler(pool: Pool, watchers: Watchers) -> Handler:
    """Handles the host's supervisor queue: processes to watch, processes to kill."""

    async def handle(message: Message) -> None:
        if isinstance(message, KillTask):
            killed = kill_group_of(message.pid, message.create_time)
            logger.info("task %s: %s (killed=%s)", message.task_id, message.reason, killed)
            return
        if not isinstance(message, WatchProcess):
            raise InvalidMessage(f"a supervisor cannot handle {message.type}")
        async with pool.acquire() as conn:
            task = await tasks_repo.get(conn, message.task_id)
        if task is not None and task.state is TaskState.ON_CPU and task.claim == message.claim:
            watchers.watch(message.task_id, message.claim, message.pid, message.create_time)

    return handle


async def main(settings: SupervisorSettings) -> None:
    """Run until SIGTERM."""
    topology = Topology(settings.namespace)
    async with stop_on_signals() as stop, AsyncExitStack() as stack:
        pool = await stack.enter_async_context(open_pool(settings.database_url))
        await check_schema(pool)
        broker = await stack.enter_async_context(
            open_broker(settings.amqp_url, topology, f"supervisor-{settings.host_id}")
        )
        redis = await stack.enter_async_context(open_redis(settings.redis_url))
        watchers = Watchers(pool, redis, RedisKeys(settings.namespace), settings.report_grace_s)
        stack.push_async_callback(watchers.close)
        channel = await broker.channel_for_consuming(prefetch=256)
        _, _, queue = await declare_all_work_queues(channel, topology, settings.host_id)
        handler = _handler(pool, watchers)

        async def on_message(incoming: AbstractIncomingMessage) -> None:
            await deliver(incoming, handler)

        tag = await queue.consume(on_message)
        worker_watch = WorkerWatch(pool, redis, RedisKeys(settings.namespace), settings.host_id)
        logger.info("supervising host %s", settings.host_id)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(worker_watch.run(stop, settings.worker_poll_s), name="worker-watch")
            tg.create_task(_reconcile_loop(settings, pool, redis, watchers, stop), name="reconcile")
        await queue.cancel(tag)
    logger.info("supervisor stopped")
