"""Watching the host's worker process: its death orphans the tasks it held.

The worker registers itself in Redis (pid, create time, instance). The supervisor follows that
registration and holds a pidfd on the registered process, so a worker killed with -9 is noticed
as soon as the kernel reaps it. A worker that is alive but silent (frozen, e.g. SIGSTOP) for
`dead_worker_s` is judged the same way: its processes are killed and its tasks lost; if it
wakes up, its late reports are fenced off and it goes on with new work.

The registration is looked up every `poll_s` while no live worker is watched (one is starting);
while one is, its exit wakes the watch at once, and its heartbeat is looked at every fifth of
`dead_worker_s`. The heartbeat is read by the supervisor's own beat, in its statement
(`heartbeat.LastBeat`), so that an idle host costs the database one statement a beat. The
registration is not read again while the worker watched lives and the host's row (as that
beat read it) names no other: a host runs one worker, and a new one registers after the old
one exits, or, started beside it by hand, shows in the row at its first beat. That read was a
Redis round trip every 2 s a host, 480 a second for a thousand idle hosts, over a third of
what they asked of Redis.
"""

import asyncio
import logging
import time
from typing import Any

from redis.asyncio import Redis

from services.supervisor.heartbeat import LastBeat
from services.supervisor.orphans import reap_worker
from shared.domain.errors import UNAVAILABLE
from shared.host.cgroups import Cgroups
from shared.host.processes import exit_waiter
from shared.messaging.presence import WorkerIdentity, registered
from shared.messaging.redis_keys import RedisKeys
from shared.runtime.health import Check
from shared.runtime.lifecycle import wait_or_stop
from shared.store.db import Pool

logger = logging.getLogger(__name__)

#: How many times a live worker's registration and heartbeat are looked at within
#: `dead_worker_s` (the heartbeat as the supervisor's last beat read it).
_LOOKS_PER_SILENCE = 5


class WorkerWatch:
    """Follows the registered worker; when its process exits, reaps what it held."""

    def __init__(
        self,
        pool: Pool,
        redis: Redis,
        keys: RedisKeys,
        host_id: str,
        cgroups: Cgroups | None,
        dead_worker_s: float,
        last: LastBeat,
    ) -> None:
        self._pool, self._redis, self._keys, self._host_id = pool, redis, keys, host_id
        #: The supervisor's last beat, which says whether the worker is silent.
        self._last = last
        self._cgroups, self._dead_worker_s = cgroups, dead_worker_s
        self._exited_at: float | None = None
        self.current: WorkerIdentity | None = None
        self._exit: asyncio.Future[None] | None = None
        self._reaped: set[str] = set()

    def health(self) -> Check:
        """The worker this supervisor watches, for its health: a fact, not a fault of its own
        (a host whose worker is gone shows in the api's health)."""
        if self.current is None:
            return Check(False, "no worker registered on this host", "none")
        return Check(True, f"watching worker {self.current.instance} (pid {self.current.pid})")

    async def run(self, stop: asyncio.Event, poll_s: float) -> None:
        """Until `stop`: follow the registration and react to the worker's exit."""
        while not stop.is_set():
            try:
                await self._step()
            except UNAVAILABLE as exc:
                logger.warning("cannot follow the worker registration: %s", exc)
            await self._wait(stop, poll_s)

    async def _wait(self, stop: asyncio.Event, poll_s: float) -> None:
        if self._exit is None:
            await wait_or_stop(stop, poll_s)
            return
        if self._exit.done():  # exited meanwhile: reaped by the next step, at once
            return
        stopper = asyncio.ensure_future(stop.wait())
        waiters: list[asyncio.Future[Any]] = [stopper, self._exit]
        every_s = max(poll_s, self._dead_worker_s / _LOOKS_PER_SILENCE)
        await asyncio.wait(waiters, timeout=every_s, return_when="FIRST_COMPLETED")
        stopper.cancel()

    async def _step(self) -> None:
        if self._exit is not None and self._exit.done() and self.current is not None:
            dead, self.current, self._exit = self.current, None, None
            self._reaped.add(dead.instance)
            why = f"worker {dead.instance} (pid {dead.pid}) died while holding the task"
            lost = await reap_worker(
                self._pool, self._host_id, dead.instance, why, self._cgroups, self._exited_at
            )
            logger.warning("worker %s died; %d task(s) lost", dead.instance, lost)
        if self.current is not None:
            await self._judge_silence(self.current)
        if self._watching_live():
            return
        found = await registered(self._redis, self._keys, self._host_id)
        if found is None or found == self.current or found.instance in self._reaped:
            return
        waiter = exit_waiter(found.pid, found.create_time)
        if waiter is None:  # registered but already gone: the registration is stale
            self.current, self._exit = found, _done()
            return
        self.current, self._exit = found, asyncio.ensure_future(waiter)
        self._exit.add_done_callback(self._note_exit)
        logger.info("watching worker %s (pid %d)", found.instance, found.pid)

    def _watching_live(self) -> bool:
        """Whether the worker watched has not exited and is still the one the host's row
        names, as the supervisor's last beat read it (or no other is named there: none yet,
        or none registered)."""
        current, named = self.current, self._last.beat.worker
        if current is None or self._exit is None or self._exit.done():
            return False
        return named is None or named == current.instance

    def _note_exit(self, _exit: "asyncio.Future[None]") -> None:
        self._exited_at = time.time()

    async def _judge_silence(self, worker: WorkerIdentity) -> None:
        """Reap `worker` if the supervisor's last beat saw its heartbeat older than
        `dead_worker_s` (`heartbeat.LastBeat`: no query of its own)."""
        seen = self._last.beat
        if seen.worker != worker.instance or not seen.worker_silent:
            return
        why = f"worker {worker.instance} (pid {worker.pid}) stopped heartbeating"
        lost = await reap_worker(self._pool, self._host_id, worker.instance, why, self._cgroups)
        if lost:
            logger.warning("worker %s is silent; %d task(s) lost", worker.instance, lost)


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
