"""Group commit for a process's task moves: the moves callers ask for while every commit slot
is busy go together into the next one.

A worker makes four moves per task (`tasks_repo.Advance`), each one commit, and
each commit one WAL flush. With several tasks in flight their moves overlap:
`TransitionWriter.advance()` queues a move, and a flusher commits what is queued, up to
`max_batch` moves in one transaction (each still its own claim-fenced compare-and-set with
its events), then the next lot. A lone move is committed at once, as one statement: nothing
waits for a batch to fill, so an idle system pays nothing for this, and a busy one pays one
commit for many moves. In a batch, the moves go to PostgreSQL in task id order, each run of
one shape (one query text: a fold of the take into `on_cpu`, a command's end...) together,
pipelined (`Connection.fetchmany`): a round trip per run, not per move, and the rows locked
in id order by the moves themselves. Where shapes interleave (more runs than shapes plus
one), the tasks' rows are locked first, in id order (one statement), and each shape goes
once (`sending`). A batch of one shape is one round trip in all: one `fetchmany` is a
transaction of its own (`_Together`).

Up to `max_commits` flushers commit at once, each a batch on a connection of its own: a move
asked for while one batch is under way starts the next flusher rather than wait for that
batch's statements, one round trip each through a busy event loop (with 32 slots, a move
waited 89 ms for its commit with one flusher, 63 ms with four).
A new flusher starts only when none is still gathering, so what is asked for meanwhile
goes into its batch. Batches hold disjoint tasks (a task has one move in flight at a time),
each locking its rows in id order, so two batches at once cannot deadlock on task rows.

The events of moves that end in a quiet state (`shared.domain.states.QUIET`: `setting_up`,
`on_cpu`...)
notify nobody; the relay polls for them, quickly only while it heard from the system lately.
So a writer given `nudge_every_s` nudges the relay (its `nudger`: the worker's publishes on
Redis, `shared/messaging/relay_nudges.py`; without one, a bare `NOTIFY`) after a commit of only
such moves when it has not for that long, `NUDGE_DELAY_S` later (a short task has ended by
then, and its end's notification took its events along: the nudge costs its run nothing):
every quiet event then reaches the relay within the delay, or follows a nudge by less than
`nudge_every_s` (`services/scheduler/main.py` keeps polling quickly that long). The worker's
other moves of a quiet state call `nudge()` after their commit.

Each caller gets its own move's outcome: the task as it is now, or None when its guard did not
match (nothing of it written). A move that fails the batch (an error, not a miss: a deadlock
with another writer, a bug) makes the flusher try each move of that batch again alone, so it
fails only its own caller.

A lost connection (PostgreSQL restarting) leaves a batch's outcome unknown. Its
flusher rides it out: it waits for the database, up to `ride_out_s`, and makes each move again.
A move's guard (its claim, its source states) makes doing it twice impossible: one that
misses and finds the task where the move leads, still under the move's claim, had landed
before the connection went, and its caller gets the task as it is. Only past `ride_out_s`
does a caller get the error. Moves asked for meanwhile go to the other flushers, which meet
the same lost connection and ride it out too; a task's own moves stay in order (its driver
awaits each).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from shared.domain.errors import UNAVAILABLE, connection_lost
from shared.domain.states import QUIET
from shared.runtime.ride_out import RIDE_OUT_PAUSE_S, RIDE_OUT_S
from shared.store import tasks_repo
from shared.store.db import Connection, Pool

logger = logging.getLogger(__name__)

#: Moves per transaction at most: enough for every slot of a big host, few enough that one
#: transaction's row locks stay brief.
MAX_BATCH: Final = 64

#: Batches committed at once at most, each on a connection of its own (module doc).
MAX_COMMITS: Final = 4

#: How often at most a worker nudges the relay, and how long after the commit (module doc).
NUDGE_EVERY_S: Final = 0.5
NUDGE_DELAY_S: Final = 0.1


@dataclass
class _Queued:
    move: tasks_repo.Advance
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
        max_commits: int = MAX_COMMITS,
        nudge_every_s: float | None = None,
        nudge_delay_s: float = NUDGE_DELAY_S,
        ride_out_s: float = RIDE_OUT_S,
        nudger: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.pool = pool
        #: How a nudge is sent (None: a `NOTIFY` on the pool).
        self.nudger = nudger
        self.ride_out_s = ride_out_s
        self.max_batch, self.max_commits = max_batch, max_commits
        self.nudge_every_s, self.nudge_delay_s = nudge_every_s, nudge_delay_s
        self._queue: list[_Queued] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self._gathering = 0  # flushers started that have not taken their batch yet
        self._nudged_at = float("-inf")  # when the last nudge went, or will go, out
        self._nudging: set[asyncio.Task[None]] = set()
        #: Batches committed and moves in them, and nudges tried, for benchmarks and tests.
        self.commits = 0
        self.moves = 0
        self.nudges = 0
        self.ridden_out = 0  # moves made again after a lost connection

    @property
    def waiting(self) -> int:
        """Moves asked for that no batch holds yet."""
        return len(self._queue)

    async def advance(self, move: tasks_repo.Advance) -> tasks_repo.Task | None:
        """Do `move` in the next commit; the task as it is then, or None if it did not match."""
        queued = _Queued(move)
        self._queue.append(queued)
        if not self._gathering and len(self._flushers) < self.max_commits:
            self._gathering += 1  # it takes whatever is queued when it first runs
            flusher = asyncio.create_task(self._flush(), name="transition-writer")
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)
        # The caller may give up waiting; the move itself is done or not as a whole.
        return await asyncio.shield(queued.done)

    async def _flush(self) -> None:
        gathering = True
        try:
            while self._queue:
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                if gathering:
                    self._gathering, gathering = self._gathering - 1, False
                await self._commit_settled(batch)
        finally:
            if gathering:  # it found nothing left (or was cancelled before it ran)
                self._gathering -= 1

    async def _commit_settled(self, batch: list[_Queued]) -> None:
        """Commit `batch`, riding out a lost connection; every caller of it is answered."""
        try:
            unknown = await self._commit(batch)
            if unknown:
                await self._ride_out(unknown)
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

    async def nudged(self) -> None:
        """Wait for the nudges under way (before the client they go through is closed)."""
        await asyncio.gather(*self._nudging, return_exceptions=True)

    async def _nudge_later(self) -> None:
        await asyncio.sleep(self.nudge_delay_s)
        self.nudges += 1  # counted before it goes: whoever hears it may look at once
        try:
            if self.nudger is not None:
                await self.nudger()
                return
            async with self.pool.acquire() as conn:
                await conn.execute("SELECT pg_notify('vigil_outbox', 'relay')")
        except UNAVAILABLE as exc:
            logger.info("could not nudge the relay: %s", exc)

    async def _commit(self, batch: list[_Queued]) -> list[_Queued]:
        """Commit `batch`, settling each move; returns the moves a lost connection left
        unsettled (whether they landed is unknown)."""
        self.commits += 1
        self.moves += len(batch)
        try:
            async with self.pool.acquire() as conn:
                if len(batch) == 1:
                    return await _alone(conn, batch[0])
                try:
                    together = _Together([queued.move for queued in batch])
                    if len(together.groups) == 1:  # one round trip, atomic (`_Together`)
                        moved = await together.apply(conn)
                    else:
                        async with conn.transaction():
                            moved = await together.apply(conn)
                except Exception as exc:
                    if conn.is_closed() or connection_lost(exc):
                        return batch
                    logger.info("a batch of %d moves failed (%s); each alone", len(batch), exc)
                    unknown = []
                    for queued in batch:
                        unknown += await _alone(conn, queued)
                    return unknown
        except Exception as exc:
            if not connection_lost(exc):
                raise
            return [queued for queued in batch if not queued.done.done()]
        for queued, task in zip(batch, moved, strict=True):
            _settle(queued, task)
        return []

    async def _ride_out(self, batch: list[_Queued]) -> None:
        """Wait for the database and make each move of `batch` again (module doc); past
        `ride_out_s`, tell their callers the error."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self.ride_out_s, 0.05
        logger.warning("database connection lost under %d move(s): riding it out", len(batch))
        while True:
            await asyncio.sleep(pause)
            pause = min(pause * 2, RIDE_OUT_PAUSE_S)
            try:
                async with self.pool.acquire() as conn:
                    for queued in batch:
                        if not queued.done.done():
                            _settle(queued, await queued.move.again(conn))
                            self.ridden_out += 1
                logger.info("database back: %d move(s) made again", len(batch))
                return
            except Exception as exc:
                if not connection_lost(exc):
                    for queued in batch:
                        _settle(queued, exc=exc)
                    return
                if loop.time() >= deadline:
                    logger.error("database away for %.0f s: moves given up", self.ride_out_s)
                    for queued in batch:
                        _settle(queued, exc=exc)
                    return


class _Together:
    """The moves of a batch, sent as `sending` says: each group of one shape (one query text)
    together, pipelined (`fetchmany`: a round trip per group, not per move), their task rows
    locked first where the groups alone would not lock them in id order (the order of every
    writer of several tasks). A batch of one group needs no transaction of its own: the
    statements of one `fetchmany` are one implicit transaction, all or none (asyncpg's
    `executemany`, PostgreSQL's extended protocol up to its `Sync`), saving the `BEGIN` and
    the `COMMIT` round trips; several groups run in the caller's transaction."""

    def __init__(self, moves: Sequence[tasks_repo.Advance]) -> None:
        self.statements = [move.statement() for move in moves]
        self.lock_first, self.groups = sending(
            [(move.task.id, query) for move, (query, _) in zip(moves, self.statements, strict=True)]
        )
        self.task_ids = [move.task.id for move in moves]

    async def apply(self, conn: Connection) -> list[tasks_repo.Task | None]:
        if self.lock_first:
            await tasks_repo.lock_in_order(conn, sorted(self.task_ids))
        moved: list[tasks_repo.Task | None] = [None] * len(self.statements)
        for indexes in self.groups:
            query = self.statements[indexes[0]][0]
            records = await conn.fetchmany(query, [self.statements[i][1] for i in indexes])
            for i, record in zip(indexes, records, strict=True):
                moved[i] = tasks_repo.moved_task(record)
        return moved


def sending(moves: Sequence[tuple[str, str]]) -> tuple[bool, list[list[int]]]:
    """How a batch of moves (task id, query text) goes to PostgreSQL: whether their task rows
    are locked first (`tasks_repo.lock_in_order`, one statement), and the groups of moves of
    one query text, in the order they are sent (by their positions in `moves`).

    A move locks its task's row, then its attempts (every writer's order). Sent in task id
    order, each run of one query text a group, the moves themselves lock the rows in id
    order: no lock is needed. That costs a round trip per run; where there are more runs than
    query texts plus one (texts interleaved: A B A B), the rows are locked first and each
    text goes once instead. A batch of two moves never needs the lock (W1's commits: half a
    statement a task)."""
    order = sorted(range(len(moves)), key=lambda i: moves[i][0])
    runs: list[list[int]] = []
    for i in order:
        if runs and moves[runs[-1][0]][1] == moves[i][1]:
            runs[-1].append(i)
        else:
            runs.append([i])
    by_text: dict[str, list[int]] = {}
    for i in order:
        by_text.setdefault(moves[i][1], []).append(i)
    if len(runs) <= len(by_text) + 1:
        return False, runs
    return True, list(by_text.values())


async def _alone(conn: Connection, queued: _Queued) -> list[_Queued]:
    """One move in a transaction of its own; [it] if a lost connection left it unsettled."""
    try:
        task = await queued.move.apply(conn)
    except Exception as exc:
        if conn.is_closed() or connection_lost(exc):
            return [queued]
        _settle(queued, exc=exc)
    else:
        _settle(queued, task)
    return []


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
