"""A simulated host: a real worker's objects with a simulated launcher, and its simulated
supervisor (`supervisor.py`)."""

import asyncio
import logging
import random
from dataclasses import dataclass, field

from redis.asyncio import Redis

from bench.simhosts.commands import Durations, SimLauncher
from bench.simhosts.supervisor import SimSupervisor
from services.supervisor.settings import SupervisorSettings
from services.worker.consumer import Consumer
from services.worker.registration import Presence, heartbeat, register, unregister
from services.worker.settings import WorkerSettings
from services.worker.stages import StageRunner
from shared.host.beats import through_redis_if
from shared.host.capacity import HostCapacity
from shared.host.fence import Lease, fence_after
from shared.messaging.amqp import Broker
from shared.messaging.redis_keys import RedisKeys
from shared.runtime.lifecycle import wait_or_stop
from shared.store.db import Pool
from shared.task_types import TaskType

logger = logging.getLogger(__name__)


@dataclass
class SimHost:
    """One simulated host, from `start` to `stop`."""

    worker: WorkerSettings
    supervisor: SupervisorSettings
    capacity: HostCapacity
    pool: Pool
    #: The hosts' beats' own connections: a real host's beat waits behind its own few
    #: tasks' moves, not behind every simulated host's.
    beats: Pool
    broker: Broker
    redis: Redis
    task_types: dict[str, TaskType]
    durations: Durations
    seed: int
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _drained: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        host_id = self.worker.host_id
        self.instance = f"{host_id}-sim"
        self.launcher = SimLauncher(self.durations, random.Random(self.seed))
        self.presence = Presence(host_id, self.instance, self.capacity)
        self.keys = RedisKeys(self.worker.namespace)
        self.runner = StageRunner(
            self.worker,
            self.pool,
            self.broker,
            self.redis,
            self.keys,
            self.task_types,
            self.instance,
            self.launcher,
            self.capacity,
        )
        self.consumer = Consumer(self.runner, self.capacity.slots, self.worker.worker_prefetch)
        self.sup = SimSupervisor(
            self.supervisor, self.pool, self.beats, self.broker, self.redis, self.launcher
        )
        self.lease = Lease()

    async def start(self) -> None:
        """Register and take work, as a worker does at its start."""
        self._tasks.append(asyncio.create_task(self.sup.run(self._stop)))
        admission = await register(
            self.pool, self.redis, self.keys, self.presence, self.worker.worker_pool
        )
        await self.consumer.start(
            self.broker, self.worker.host_id, self.worker.worker_pool, admission
        )
        self._tasks.append(
            asyncio.create_task(
                heartbeat(
                    self.beats,
                    self.redis,
                    self.keys,
                    self.presence,
                    self.worker.heartbeat_s,
                    self._drained,
                    self.consumer.admit,
                    self.lease,
                    self.consumer.note_held,
                    through_redis_if(
                        self.worker.beats_through_redis,
                        self.redis,
                        self.keys,
                        self.worker.dead_host_s,
                    ),
                )
            )
        )
        self._tasks.append(asyncio.create_task(self._fence()))

    async def _fence(self) -> None:
        """The worker's fence: every command killed while its lease is too old."""
        limit = fence_after(self.worker.fence_timeout_s)
        while not await wait_or_stop(self._drained, self.worker.heartbeat_s):
            if self.lease.age() > limit:
                self.sup.fenced += self.launcher.kill_all()

    async def stop(self, graceful_s: float) -> None:
        """Stop as a worker does on SIGTERM: intake stopped, drained, unregistered."""
        self.runner.stopping.set()
        await self.consumer.stop_intake()
        await self.consumer.drain(graceful_s)
        self._drained.set()
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await unregister(self.pool, self.redis, self.keys, self.presence)
