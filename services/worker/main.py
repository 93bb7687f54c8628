"""The worker service: register, consume work, heartbeat; drain on SIGTERM."""

import asyncio
import dataclasses
import logging
import os
import secrets
from contextlib import AsyncExitStack
from pathlib import Path

from services.worker import launch, limits
from services.worker.consumer import Consumer
from services.worker.registration import Presence, heartbeat, register, unregister
from services.worker.settings import WorkerSettings
from services.worker.stages import StageRunner
from shared.host import fence, uid_ranges
from shared.host import health as host_health
from shared.host.beats import through_redis_if
from shared.host.cgroups import Cgroups, slow_moves_hint
from shared.host.fence import Lease
from shared.messaging.amqp import open_broker
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology
from shared.runtime.health import Health
from shared.runtime.lifecycle import stop_on_signals
from shared.store import installation_repo
from shared.store.db import Pool, check_schema, open_pool
from shared.task_types import load_task_types

logger = logging.getLogger(__name__)


async def _with_own_uids(
    launched: launch.Choice, pool: Pool, settings: WorkerSettings
) -> launch.Choice:
    """Confined jobs' uids from a range this installation holds on this host (`UidRangeHeld`
    when another one holds it): the configured `VIGIL_JOB_UID_BASE`, else a free one."""
    if launched.confinement is None:
        return launched  # jobs run as the worker's own user: no uid of theirs to share
    async with pool.acquire() as conn:
        installation = await installation_repo.installation_id(conn)
    asked = settings.job_uid_base if "job_uid_base" in settings.model_fields_set else None
    claims = Path(settings.uid_ranges_dir)
    base = await asyncio.to_thread(uid_ranges.claim, claims, installation, asked)
    logger.info("job uids from %d: installation %s holds them on this host", base, installation)
    own = dataclasses.replace(launched.confinement, uid_base=base)
    return dataclasses.replace(launched, confinement=own)


async def main(settings: WorkerSettings) -> None:
    """Run until SIGTERM, then stop intake, drain up to the graceful timeout, and close."""
    instance = f"{settings.host_id}-{os.getpid()}-{secrets.token_hex(3)}"
    capacity = settings.capacity()
    presence = Presence(settings.host_id, instance, capacity)
    keys = RedisKeys(settings.namespace)
    launched = launch.choose(settings)  # CannotConfine before connecting to anything
    health = Health("worker")
    async with stop_on_signals() as stop, AsyncExitStack() as stack:
        await stack.enter_async_context(
            health.serve(settings.health_host, settings.worker_health_port)
        )
        health.starting("connecting to PostgreSQL")
        pool = await stack.enter_async_context(
            open_pool(settings.database_url, max_size=20, generic_plans=True, wait=True)
        )
        await check_schema(pool)
        launched = await _with_own_uids(launched, pool, settings)
        health.starting("connecting to RabbitMQ")
        broker = await stack.enter_async_context(
            open_broker(settings.amqp_url, Topology(settings.namespace), f"worker-{instance}")
        )
        health.starting("connecting to Redis")
        redis = await stack.enter_async_context(open_redis(settings.redis_url))
        health.starting("registering")
        cgroups = Cgroups.detect(settings.namespace, settings.cgroup_root)
        if cgroups is not None and (hint := slow_moves_hint()) is not None:
            logger.warning(hint)
        logger.info(limits.enforced(cgroups))
        launcher = launched.launcher(pool, cgroups)
        runner = StageRunner(
            settings, pool, broker, redis, keys, load_task_types(), instance, launcher, capacity
        )
        stack.push_async_callback(runner.stores.close)
        admission = await register(pool, redis, keys, presence, settings.worker_pool)
        consumer = Consumer(runner, capacity.slots, settings.worker_prefetch)
        await consumer.start(broker, settings.host_id, settings.worker_pool, admission)
        logger.info(
            "worker %s up: %s; commands run %s",
            instance,
            capacity.describe(),
            launcher.describe(),
        )
        drained = asyncio.Event()  # the heartbeat goes on while draining: the worker lives

        def removed() -> None:  # an operator removed the host: this worker stops
            if not stop.is_set():
                logger.warning(
                    "host %s was removed by an operator: worker %s stops (a worker started"
                    " under this id again brings the host back as a new one)",
                    settings.host_id,
                    instance,
                )
                stop.set()

        lease = Lease()
        intake = lambda: {"intake": consumer.intake()}  # noqa: E731
        health.up(host_health.probe(settings, lease, broker, redis, intake))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                heartbeat(
                    pool,
                    redis,
                    keys,
                    presence,
                    settings.heartbeat_s,
                    drained,
                    consumer.admit,
                    lease,
                    consumer.note_held,
                    through_redis_if(
                        settings.beats_through_redis, redis, keys, settings.dead_host_s
                    ),
                    removed,
                ),
                name="heartbeat",
            )
            tg.create_task(  # the fence holds even if this host's supervisor is dead
                fence.guard_host(lease, settings, cgroups, drained),
                name="fence",
            )
            await stop.wait()
            runner.stopping.set()  # a command killed with it is the host's loss (`_judged`)
            await consumer.stop_intake()
            logger.info("intake stopped; %d task(s) in flight", consumer.in_flight)
            cancelled = await consumer.drain(settings.graceful_timeout_s)
            logger.info("drained; %d task(s) cancelled and failed as lost", cancelled)
            drained.set()
        await unregister(pool, redis, keys, presence)
    logger.info("worker %s stopped", instance)
