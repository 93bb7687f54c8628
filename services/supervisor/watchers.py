"""A watcher coroutine per running process: notified of its exit by pidfd, then it judges.

When a watched process exits, its worker (the parent) notes the exit in Redis at once and reports
it in PostgreSQL once the output is flushed. A noted exit is the worker's to report (if the
worker dies first, the worker watch reaps the task). If the task is still `on_cpu` under the same
claim after `report_grace_s` with no note, no one will report it: the process died of something
outside Vigil, and the task fails as `signal`.
"""

import asyncio
import logging
from uuid import UUID

from redis.asyncio import Redis

from shared import loss, tasks_repo
from shared.db import Pool
from shared.errors import UNAVAILABLE
from shared.outcomes import vanished_outcome
from shared.processes import exit_waiter
from shared.redis_keys import RedisKeys
from shared.states import TaskState

logger = logging.getLogger(__name__)

_POLL_S = 0.05


class Watchers:
    """The set of watched processes of this host, keyed by (task id, claim)."""

    def __init__(self, pool: Pool, redis: Redis, keys: RedisKeys, report_grace_s: float) -> None:
        self._pool, self._redis, self._keys, self._grace = pool, redis, keys, report_grace_s
        self._tasks: dict[tuple[str, UUID], asyncio.Task[None]] = {}

    def is_watching(self, task_id: str, claim: UUID) -> bool:
        return (task_id, claim) in self._tasks

    def watch(self, task_id: str, claim: UUID, pid: int, create_time: float) -> None:
        """Start watching (idempotent: a process already watched is left alone)."""
        key = (task_id, claim)
        if key in self._tasks:
            return
        task = asyncio.create_task(
            self._watch(task_id, claim, pid, create_time), name=f"watch-{task_id}"
        )
        self._tasks[key] = task
        task.add_done_callback(lambda _t: self._tasks.pop(key, None))
        logger.info("watching task %s (pid %d)", task_id, pid, extra={"task_id": task_id})

    async def _watch(self, task_id: str, claim: UUID, pid: int, create_time: float) -> None:
        waiter = exit_waiter(pid, create_time)
        if waiter is not None:
            await waiter
        await self._judge(task_id, claim, pid)

    async def _judge(self, task_id: str, claim: UUID, pid: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace
        while True:
            async with self._pool.acquire() as conn:
                task = await tasks_repo.get(conn, task_id)
                reported = task is None or task.state is not TaskState.ON_CPU or task.claim != claim
                if reported or await self._noted(task_id, claim):
                    return
                if loop.time() >= deadline:
                    assert task is not None
                    if task.pid == pid and await loss.declare(conn, task, vanished_outcome()):
                        logger.warning("task %s: process %d vanished unreported", task_id, pid)
                    return
            await asyncio.sleep(_POLL_S)

    async def _noted(self, task_id: str, claim: UUID) -> bool:
        """Whether the worker noted this exit (it will report it); unknown counts as no."""
        try:
            note = await self._redis.get(self._keys.task_exit(task_id))
        except UNAVAILABLE as exc:
            logger.warning("cannot read the exit note of task %s: %s", task_id, exc)
            return False
        return isinstance(note, str) and note.split(" ")[0] == str(claim)

    async def close(self) -> None:
        """Stop watching (the processes go on; a new supervisor re-attaches to them)."""
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
