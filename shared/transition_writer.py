"""Group commit for a process's task moves: the moves callers ask for while a commit is under
way go together into the next one.

A worker makes four moves per task (`tasks_repo.advance`), each one commit, and each commit one
WAL flush. With several tasks in flight their moves overlap: `TransitionWriter.advance()` queues
a move, and one flusher commits what is queued, up to `max_batch` moves in one transaction
(each still its own claim-fenced compare-and-set with its events), then the next lot. A lone
move is committed at once, as one statement: nothing waits for a batch to fill, so an idle
system pays nothing for this, and a busy one pays one commit for many moves.

The events of moves that end in a quiet state (`shared.states.QUIET`: `setting_up`, `on_cpu`...)
notify nobody; the relay polls for them, quickly only while it heard from the system lately.
So a writer given `nudge_every_s` nudges the relay (a bare `NOTIFY`) after a commit of only
such moves when it has not for that long, `NUDGE_DELAY_S` later (a short task has ended by
then, and its end's notification took its events along: the nudge costs its run nothing):
every quiet event then reaches the relay within the delay, or follows a nudge by less than
`nudge_every_s` (`services/scheduler/main.py` keeps polling quickly that long). The worker's
other moves of a quiet state call `nudge()` after their commit.

Each caller gets its own move's outcome: the task as it is now, or None when its guard did not
match (nothing of it written). A move that fails the batch (an error, not a miss: a deadlock
with another writer, a bug) makes the flusher try each move of that batch again alone, so it
fails only its own caller. A lost connection fails every caller of its batch with that error:
whether the commit landed is unknown, exactly as for a move made alone.
"""

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from uuid import UUID

from shared import tasks_repo
from shared.db import Connection, Pool
from shared.errors import UNAVAILABLE
from shared.states import QUIET, TaskState

logger = logging.getLogger(__name__)

#: Moves per transaction at most: enough for every slot of a big host, few enough that one
#: transaction's row locks stay brief.
MAX_BATCH: Final = 64

#: How often at most a worker nudges the relay, and how long after the commit (module doc).
NUDGE_EVERY_S: Final = 0.5
NUDGE_DELAY_S: Final = 0.1


@dataclass(frozen=True)
class Move:
    """What `tasks_repo.advance` takes, to be done in some batch."""

    task: tasks_repo.Task
    claim: UUID
    path: Sequence[TaskState]
    changes: dict[str, Any] | None = None
    close: tasks_repo.CloseAttempt | None = None
    open_: tasks_repo.OpenAttempt | None = None
    unless_suspended: bool = False
    unless_waits: str | None = None

    async def apply(self, conn: Connection) -> tasks_repo.Task | None:
        return await tasks_repo.advance(
            conn,
            self.task,
            self.claim,
            self.path,
            changes=self.changes,
            close=self.close,
            open_=self.open_,
            unless_suspended=self.unless_suspended,
            unless_waits=self.unless_waits,
        )


@dataclass
class _Queued:
    move: Move
    done: "asyncio.Future[tasks_repo.Task | None]" = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class TransitionWriter:
    """One per process: `advance()` from any number of coroutines; commits in batches."""

    def __init__(
        self,
        pool: Pool,
        *,
        max_batch: int = MAX_BATCH,
        nudge_every_s: float | None = None,
        nudge_delay_s: float = NUDGE_DELAY_S,
    ) -> None:
        self.pool = pool
        self.max_batch = max_batch
        self.nudge_every_s, self.nudge_delay_s = nudge_every_s, nudge_delay_s
        self._queue: list[_Queued] = []
        self._flusher: asyncio.Task[None] | None = None
        self._nudged_at = float("-inf")  # when the last nudge went, or will go, out
        self._nudging: set[asyncio.Task[None]] = set()
        #: Batches committed and moves in them, and nudges sent, for benchmarks and tests.
        self.commits = 0
        self.moves = 0
        self.nudges = 0

    async def advance(self, move: Move) -> tasks_repo.Task | None:
        """Do `move` in the next commit; the task as it is then, or None if it did not match."""
        queued = _Queued(move)
        self._queue.append(queued)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="transition-writer")
        # The caller may give up waiting; the move itself is done or not as a whole.
        return await asyncio.shield(queued.done)

    async def _flush(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            try:
                await self._commit(batch)
                if all(queued.move.path[-1] in QUIET for queued in batch):
                    await self.nudge()
            except BaseException as exc:  # the pool itself failed, or this task was cancelled
                for queued in batch:
                    _settle(queued, exc=exc)
                if isinstance(exc, asyncio.CancelledError):
                    for queued in self._queue:
                        _settle(queued, exc=exc)
                    self._queue.clear()
                    raise

    async def nudge(self) -> None:
        """Wake the relay (a `NOTIFY` of its own) `nudge_delay_s` from now, unless this writer
        did (or will) less than `nudge_every_s` before; after a commit, never instead of one.
        Returns at once. Best effort: a nudge that fails leaves the events to the relay's slow
        poll."""
        now = asyncio.get_running_loop().time()
        if self.nudge_every_s is None or now - self._nudged_at < self.nudge_every_s:
            return
        self._nudged_at = now + self.nudge_delay_s
        task = asyncio.create_task(self._nudge_later(), name="relay-nudge")
        self._nudging.add(task)
        task.add_done_callback(self._nudging.discard)

    async def _nudge_later(self) -> None:
        await asyncio.sleep(self.nudge_delay_s)
        try:
            async with self.pool.acquire() as conn:
                await conn.execute("SELECT pg_notify('vigil_outbox', 'relay')")
        except UNAVAILABLE as exc:
            logger.info("could not nudge the relay: %s", exc)
            return
        self.nudges += 1

    async def _commit(self, batch: list[_Queued]) -> None:
        self.commits += 1
        self.moves += len(batch)
        async with self.pool.acquire() as conn:
            if len(batch) == 1:
                await _alone(conn, batch[0])
                return
            # Task rows locked in one order, the order other writers of several tasks use.
            batch.sort(key=lambda queued: queued.move.task.id)
            try:
                async with conn.transaction():
                    moved = [await queued.move.apply(conn) for queued in batch]
            except Exception as exc:
                if conn.is_closed():  # whether the commit landed is unknown
                    for queued in batch:
                        _settle(queued, exc=exc)
                    return
                logger.info("a batch of %d moves failed (%s); each alone", len(batch), exc)
                for queued in batch:
                    await _alone(conn, queued)
                return
        for queued, task in zip(batch, moved, strict=True):
            _settle(queued, task)


async def _alone(conn: Connection, queued: _Queued) -> None:
    try:
        task = await queued.move.apply(conn)
    except Exception as exc:
        _settle(queued, exc=exc)
    else:
        _settle(queued, task)


def _settle(
    queued: _Queued, task: tasks_repo.Task | None = None, *, exc: BaseException | None = None
) -> None:
    if queued.done.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        queued.done.cancel()
    elif exc is not None:
        queued.done.set_exception(exc)
    else:
        queued.done.set_result(task)
