"""A simulated host's supervisor: what a real one asks of the control plane, acted out on
simulated commands.

It beats (`services.supervisor.heartbeat`), follows its worker's registration and heartbeat
(`WorkerWatch`: the registered pid is the simulator's own, alive as long as it runs), and
every `reconcile_s` reads what the real reconcile reads: the tasks on_cpu here, stale worker
instances, the claims of the commands running (the stray check, made only while some run) and
the kills owed. Kill orders, owed kills, strays and an expired lease kill simulated commands;
freezes stop and continue them. Hand-overs are taken from Redis (`handovers.follow`, one
wait for a group of hosts) and dropped. Processes it never has: no pidfd watcher, no
vitals, no /proc scan.
"""

import asyncio
import logging

from aio_pika.abc import AbstractIncomingMessage
from redis.asyncio import Redis

from bench.simhosts.commands import SimLauncher
from services.supervisor.heartbeat import LastBeat, heartbeat
from services.supervisor.reconcile import on_cpu_here, reap_stale
from services.supervisor.settings import SupervisorSettings
from services.supervisor.strays import legitimate
from services.supervisor.worker_watch import WorkerWatch
from shared.domain.errors import UNAVAILABLE, InvalidMessage
from shared.domain.messages import FreezeTask, KillTask, Message, WatchProcess
from shared.host.beats import through_redis_if
from shared.host.fence import Lease, fence_after
from shared.messaging.amqp import Broker, deliver
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import declare_all_work_queues
from shared.runtime.lifecycle import wait_or_stop
from shared.store import attempts_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)


class SimSupervisor:
    """One simulated host's supervisor."""

    def __init__(
        self,
        settings: SupervisorSettings,
        pool: Pool,
        beats: Pool,
        broker: Broker,
        redis: Redis,
        launcher: SimLauncher,
    ) -> None:
        self.settings, self.pool, self.broker, self.redis = settings, pool, broker, redis
        self.beats = beats
        self.launcher = launcher
        self.keys = RedisKeys(settings.namespace)
        self.instance = f"{settings.host_id}-sup"
        self.lease = Lease()
        self.last = LastBeat()
        #: Kill orders and owed kills acted on; commands killed by the fence.
        self.killed = 0
        self.fenced = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: consume the supervisor queue, beat, watch the worker, reconcile, and
        fence."""
        settings = self.settings
        channel = await self.broker.channel_for_consuming(prefetch=256)
        _, _, queue = await declare_all_work_queues(channel, self.broker.topology, settings.host_id)

        async def on_message(incoming: AbstractIncomingMessage) -> None:
            await deliver(incoming, self._handle)

        tag = await queue.consume(on_message)
        watch = WorkerWatch(
            self.pool,
            self.redis,
            self.keys,
            settings.host_id,
            None,
            settings.dead_worker_s,
            self.last,
        )
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(
                    heartbeat(
                        self.beats,
                        settings.host_id,
                        self.instance,
                        settings.heartbeat_s,
                        stop,
                        self.lease,
                        settings.dead_worker_s,
                        self.last,
                        through_redis_if(
                            settings.beats_through_redis,
                            self.redis,
                            self.keys,
                            settings.dead_host_s,
                        ),
                    )
                )
                tg.create_task(watch.run(stop, settings.worker_poll_s))
                tg.create_task(self._reconcile_every(stop))
                tg.create_task(self._fence(stop))
        finally:
            await queue.cancel(tag)
            await channel.close()

    async def _handle(self, message: Message) -> None:
        if isinstance(message, KillTask):
            command = self.launcher.running.get(message.task_id)
            if command is not None and command.claim == message.claim:
                self.killed += command.kill()
            async with self.pool.acquire() as conn:
                await attempts_repo.mark_reaped(conn, message.task_id, message.pid)
        elif isinstance(message, FreezeTask):
            command = self.launcher.running.get(message.task_id)
            if command is not None and command.claim == message.claim:
                command.freeze(message.frozen)
        elif not isinstance(message, WatchProcess):  # a hand-over: its worker sees its exit
            raise InvalidMessage(f"a supervisor cannot handle {message.type}")

    async def _reconcile_every(self, stop: asyncio.Event) -> None:
        while not await wait_or_stop(stop, self.settings.reconcile_s):
            try:
                await self.reconcile()
            except UNAVAILABLE as exc:
                logger.warning("%s: reconcile failed: %s", self.settings.host_id, exc)

    async def reconcile(self) -> None:
        """The real reconcile's reads (those the last beat says would find something), acted
        out on the simulated commands."""
        host_id, seen = self.settings.host_id, self.last.beat
        if seen.running:
            await on_cpu_here(self.pool, host_id)
        if seen.stale_holders:
            await reap_stale(self.pool, self.redis, self.keys, host_id, None)
        running = dict(self.launcher.running)
        if running:
            legit = await legitimate(self.pool, set(running))
            for task_id, command in running.items():
                if (task_id, command.claim) not in legit:
                    self.killed += command.kill()
        if not seen.kills_owed:
            return
        async with self.pool.acquire() as conn:
            owed = await attempts_repo.kills_owed(conn, host_id)
        for kill in owed:
            still = self.launcher.running.get(kill.task_id)
            if still is not None and still.claim == kill.claim:
                self.killed += still.kill()
            async with self.pool.acquire() as conn:
                await attempts_repo.mark_reaped(conn, kill.task_id, kill.pid)

    async def _fence(self, stop: asyncio.Event) -> None:
        """The supervisor's fence: every command killed while the lease is too old."""
        limit = fence_after(self.settings.fence_timeout_s)
        while not await wait_or_stop(stop, self.settings.heartbeat_s):
            if self.lease.age() > limit:
                self.fenced += self.launcher.kill_all()
