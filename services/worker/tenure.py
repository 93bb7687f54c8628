"""A task this worker holds, from its take to its finish, and every move it makes under its
claim (the held task's one owner in the worker).

A `Tenure` is made by the take (`claims.Taker`); the stage machine (`stages.py`, `runs.py`)
asks it for each step: `advance` (a successful move in one statement, committed with the
moves of other tasks that overlap it), `finish` (the attempt closed and the task moved, in one
transaction; a late report kept on its attempt), `on_cpu`, `queue`, `release`, `fail`,
`abandon`. Every one is a compare-and-set fenced by the claim: if anyone else moved the task
(cancelled, declared lost), it fails with `StaleState` (or changes nothing), and the worker
lets go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final, Protocol
from uuid import UUID

from shared.domain.errors import UNAVAILABLE, StaleState
from shared.domain.messages import Severity
from shared.domain.outcomes import Outcome, worker_failed
from shared.domain.outputs import UpstreamOutput
from shared.domain.states import QUIET, Stage, TaskState, failure_state_for
from shared.domain.status_report import StatusReport
from shared.operations import loss
from shared.store import (
    attempts_repo,
    job_errors_repo,
    jobs_repo,
    outputs_repo,
    quota_repo,
    tasks_repo,
)
from shared.store.db import Connection, Pool
from shared.store.transition_writer import TransitionWriter
from shared.task_types.base import OutputRecord

S = TaskState
logger = logging.getLogger(__name__)

_FAIL_TRIES: Final = 30
_FAIL_PAUSE_S: Final = 1.0


class Hold(StrEnum):
    """Where a held task stands in this worker beside its state in PostgreSQL: what the
    task's next move carries along (`Tenure.carried`, an attempt's number)."""

    #: Taken in this worker only (a folded take): the task is still `new` in PostgreSQL,
    #: this worker's by the work message it has not acked; its take, when written, opens the
    #: setup attempt numbered `carried`.
    PROMISED = "promised"
    #: Promised and set up: its next move is `new -> setting_up -> queued -> on_cpu` in one
    #: statement, opening and closing setup attempt `carried`.
    PROMISED_SET_UP = "promised_set_up"
    #: Durably taken; the last move opened attempt `carried` for the stage that follows,
    #: which has not taken it yet.
    OPENED = "opened"
    #: Durably taken and set up: setup attempt `carried` stays open until the task is
    #: recorded `queued` (or goes through `queued` to `on_cpu` in one move).
    SET_UP = "set_up"
    #: Durably taken, nothing carried: a stage runs, or the task rests.
    HELD = "held"


#: The stage a hold may go to from each (`check_hold`).
HOLD_MOVES: Final[Mapping[Hold, frozenset[Hold]]] = {
    Hold.PROMISED: frozenset({Hold.PROMISED_SET_UP, Hold.OPENED}),  # set up, or take written
    Hold.PROMISED_SET_UP: frozenset({Hold.SET_UP, Hold.OPENED}),  # take written; on_cpu move
    Hold.OPENED: frozenset({Hold.HELD, Hold.OPENED}),  # its stage took it; a move
    Hold.SET_UP: frozenset({Hold.HELD, Hold.OPENED}),  # queued; the move to on_cpu
    Hold.HELD: frozenset({Hold.HELD, Hold.OPENED, Hold.SET_UP}),  # a move; set up
}
#: The holds of a take not written yet.
PROMISES: Final = frozenset({Hold.PROMISED, Hold.PROMISED_SET_UP})


def check_hold(src: Hold, dst: Hold) -> None:
    """Raise `ValueError` unless a held task may go from `src` to `dst` (`HOLD_MOVES`)."""
    if dst not in HOLD_MOVES[src]:
        raise ValueError(f"a held task cannot go from {src} to {dst}")


class TakingWorker(Protocol):
    """What a held task needs of the worker that took it (`claims.Taker` is the one): its
    pool, its move writer, its ids, and the take's own moves."""

    @property
    def pool(self) -> Pool: ...

    @property
    def writer(self) -> TransitionWriter: ...

    @property
    def instance(self) -> str: ...

    @property
    def host_id(self) -> str: ...

    async def take_now(self, held: Tenure) -> None: ...

    def take_changes(self, task: tasks_repo.Task) -> dict[str, Any]: ...

    async def lose(self, task_id: str, claim: UUID, why: str) -> bool: ...


@dataclass
class Tenure:
    """A task this worker holds: the row as it was taken, its job, and the claim."""

    #: Who took it (this worker instance on this host): its pool, writer and ids.
    taker: TakingWorker
    task: tasks_repo.Task
    job: jobs_repo.Job
    claim: UUID
    state: TaskState
    input: Any = None  # the task's input, a chained one resolved to its upstream outputs
    #: Where it stands in this worker (`Hold`), and the attempt that carries along.
    hold: Hold = Hold.HELD
    carried: int | None = None
    #: How many times the input's cluster stage started before this take (its lineage too).
    cluster_starts: int = 0
    #: Called once the take is durable (the consumer acks the message then).
    on_taken: Callable[[], Awaitable[None]] | None = None
    #: A chained task's upstream outputs, by name (what setup places in its work dir).
    upstream: dict[str, UpstreamOutput] = field(default_factory=dict)

    def _to(self, hold: Hold, carried: int | None = None) -> None:
        check_hold(self.hold, hold)
        self.hold, self.carried = hold, carried

    @property
    def promised(self) -> bool:
        """Whether its take is not written yet (folded into the `on_cpu` move)."""
        return self.hold in PROMISES

    @property
    def unqueued(self) -> bool:
        """Whether it is set up but not yet recorded `queued`."""
        return self.hold in (Hold.SET_UP, Hold.PROMISED_SET_UP)

    def next_attempt(self) -> int:
        """The number of the attempt the next move opens (after the setup attempt that a
        promised take's move opens and closes first)."""
        return self.task.attempt + (2 if self.hold is Hold.PROMISED_SET_UP else 1)

    def opened_for_stage(self) -> int | None:
        """The attempt the take or the last move opened for the stage now starting (the
        stage takes it), or None: the stage opens its own."""
        attempt = self.carried
        if self.hold is Hold.OPENED:
            self._to(Hold.HELD)
        elif self.hold is not Hold.PROMISED:  # its take, when written, opens that one
            return None
        return attempt

    def setup_done(self, attempt: int) -> None:
        """Its setup succeeded under `attempt`, which stays open until it is `queued`."""
        self._to(Hold.PROMISED_SET_UP if self.hold is Hold.PROMISED else Hold.SET_UP, attempt)

    async def took(self, task: tasks_repo.Task) -> None:
        """Its take is written (`task` as it is now): acked then."""
        self.task = task
        self._to(Hold.OPENED if self.hold is Hold.PROMISED else Hold.SET_UP, self.carried)
        if self.on_taken is not None:
            await self.on_taken()

    async def durable(self) -> None:
        """Make a folded take durable before any other write of the task (StaleState if it
        is not ours any more: `Taker.take_now`)."""
        if self.promised:
            await self.taker.take_now(self)

    # -- moves -------------------------------------------------------------------------------

    async def advance(
        self,
        path: tuple[TaskState, ...],
        outcome: Outcome | None,
        *,
        changes: dict[str, Any] | None = None,
        close: tasks_repo.CloseAttempt | None = None,
        open_: Stage | None = None,
        pid: int | None = None,
        open_done: bool = False,
        unless_suspended: bool = False,
        unless_waits: str | None = None,
        first: tasks_repo.OpenAttempt | None = None,
    ) -> tasks_repo.Task | None:
        """A successful move in one statement (`tasks_repo.Advance`, committed with
        the moves of other tasks that overlap it); the task as it is now, or None when it did
        not match (the caller then takes its general path). A folded take is made durable
        first, unless this move is the one it rides on (`first`)."""
        if first is None:
            await self.durable()
        taker = self.taker
        opening = (
            tasks_repo.OpenAttempt(
                open_.value,
                taker.host_id,
                taker.instance,
                pid,
                done=open_done,  # ended with the move, with the status file closing the last
                status=close.status if open_done and close is not None else None,
            )
            if open_ is not None
            else None
        )
        sets = (outcome.changes() if outcome else {}) | (changes or {})
        moved = await taker.writer.advance(
            tasks_repo.Advance(
                self.task,
                self.claim,
                path,
                changes=sets,
                close=close,
                open_=opening,
                unless_suspended=unless_suspended,
                unless_waits=unless_waits,
                first=first,
            )
        )
        if moved is not None:
            self.task, self.state = moved, moved.state
            if opening is not None and not opening.done:
                self._to(Hold.OPENED, moved.attempt)
            else:
                self._to(Hold.HELD)
        return moved

    async def on_cpu(
        self, attempt: int, pid: int, create_time: float, then: Callable[[], None]
    ) -> bool:
        """queued -> on_cpu with the cluster attempt opened (number `attempt`, with the
        command's pid), then `then()` (the hand-over to the supervisor). A task just set up
        goes through `queued` in the same move, closing its setup attempt; a promised one is
        taken in it too. False when the job was suspended since setup (the task is then
        `queued`); `StaleState` when the task is not ours any more.

        A move that misses takes the task one hold down (its take written, then `queued`
        recorded, each the general way that finds out why not) and is made again from there."""
        while await self._to_cpu(pid, create_time) is None:
            if self.hold is Hold.PROMISED_SET_UP:
                await self.durable()
            elif self.hold is Hold.SET_UP:
                await self.queue()
            elif await self._suspended():
                return False
            else:
                raise StaleState(f"task {self.task.id} is no longer queued under our claim")
        if self.carried != attempt:  # the environment told the command another number
            raise RuntimeError(f"task {self.task.id}: opened attempt {self.carried}, not {attempt}")
        self._to(Hold.HELD)
        then()
        return True

    async def _to_cpu(self, pid: int, create_time: float) -> tasks_repo.Task | None:
        """The move to `on_cpu` from where the task stands (`on_cpu`); None when it missed."""
        taker = self.taker
        running = {"pid": pid, "pid_create_time": create_time}
        if self.hold is Hold.PROMISED_SET_UP:  # the take, the setup attempt and on_cpu: one move
            moved = await self.advance(
                (S.NEW, S.SETTING_UP, S.QUEUED, S.ON_CPU),
                None,
                changes=taker.take_changes(self.task) | running,
                open_=Stage.CLUSTER,
                pid=pid,
                unless_suspended=True,
                first=tasks_repo.OpenAttempt(
                    Stage.SETUP.value, taker.host_id, taker.instance, done=True, outcome=S.QUEUED
                ),
            )
            if moved is not None and self.on_taken is not None:
                await self.on_taken()
            return moved
        set_up = self.carried if self.hold is Hold.SET_UP else None
        return await self.advance(
            (S.SETTING_UP, S.QUEUED, S.ON_CPU) if set_up is not None else (S.QUEUED, S.ON_CPU),
            None,
            changes=running,
            close=tasks_repo.CloseAttempt(set_up) if set_up is not None else None,
            open_=Stage.CLUSTER,
            pid=pid,
            unless_suspended=True,
        )

    async def _suspended(self) -> bool:
        async with self.taker.pool.acquire() as conn:
            return await jobs_repo.is_suspended(conn, self.job.id)

    async def queue(self) -> None:
        """setting_up -> queued, closing the setup attempt (StaleState if not ours any more)."""
        await self.durable()
        attempt = self.carried
        if self.hold is not Hold.SET_UP or attempt is None:
            raise ValueError(f"task {self.task.id} is not set up to be queued ({self.hold})")
        done = Outcome(S.QUEUED)
        moved = await self.advance(
            (S.SETTING_UP, S.QUEUED), done, close=tasks_repo.CloseAttempt(attempt)
        )
        if moved is None:  # not ours any more: the general path says why (and records it)
            await self.finish(S.SETTING_UP, attempt, done, keep_claim=True)

    async def post_processing(self) -> int | None:
        """data_ready -> post_processing with its attempt opened (its number); None when the
        task waits for prerequisites first (its claim is then given back)."""
        async with self.taker.pool.acquire() as conn, conn.transaction():
            if await tasks_repo.waits_on_prerequisites(conn, self.task.id, "post_processing"):
                await self.give_back(conn, S.DATA_READY)
                return None
            self.task = await tasks_repo.transition(
                conn,
                self.task.id,
                S.POST_PROCESSING,
                among=frozenset({S.DATA_READY}),
                claim=self.claim,
                changes={"worker": self.taker.instance},
            )
            attempt = await self.open_attempt(conn, Stage.POST_PROCESSING.value)
        await self.taker.writer.nudge()
        self.state = S.POST_PROCESSING
        self._to(Hold.HELD)
        return attempt

    # -- attempts ----------------------------------------------------------------------------

    async def start_attempt(self, stage: str) -> int:
        await self.durable()
        async with self.taker.pool.acquire() as conn, conn.transaction():
            return await self.open_attempt(conn, stage)

    async def open_attempt(self, conn: Connection, stage: str) -> int:
        """Open the task's next attempt (of `stage` or a hook) in the caller's transaction."""
        taker = self.taker
        row = await attempts_repo.start(
            conn, self.task.id, self.claim, stage, host=taker.host_id, worker=taker.instance
        )
        self.task = replace(self.task, attempt=row.attempt)
        return row.attempt

    async def end_hook(
        self,
        attempt: int,
        state: TaskState,
        failure: Outcome | None,
        changes: dict[str, Any],
    ) -> None:
        """Record the hook's attempt and move the task (its failure fields stay as they were)."""
        async with self.taker.pool.acquire() as conn, conn.transaction():
            task = await tasks_repo.transition(
                conn,
                self.task.id,
                state,
                among=frozenset({self.state}),
                claim=self.claim,
                changes=changes if failure is None else {"claim": None, "worker": None},
            )
            await attempts_repo.finish(
                conn,
                self.task.id,
                attempt,
                state.value,
                failure_class=failure.failure_class if failure else None,
                error_brief=failure.brief if failure else None,
                error_detail=failure.detail if failure else None,
            )
        if state in QUIET:
            await self.taker.writer.nudge()
        self.task, self.state = task, state
        self._to(Hold.HELD)

    # -- the finish --------------------------------------------------------------------------

    async def finish(
        self,
        src: TaskState,
        attempt: int,
        outcome: Outcome,
        *,
        keep_claim: bool = False,
        status: StatusReport | None = None,
        outputs: list[OutputRecord] | None = None,
        errors_of: list[Severity] | None = None,
        since: float | None = None,
        store_quota_bytes: int = 0,
    ) -> None:
        """Close the attempt and move the task, in one transaction (fenced by the claim).

        `since`: when the failure happened (epoch seconds), for the detection latency.

        `errors_of`: the task failed on its error log; keep those records with the job.

        `outputs`: recorded with the move, their stored bytes counted against the job's owner's
        quota (`store_quota_bytes`: the installation's default); `OverQuota` when they would go
        over it, and nothing is written.

        A failure is left for the scheduler's triage (recover, resubmit or give up). A report
        that comes too late (the task was declared lost, timed out, cancelled...) changes
        nothing; it is kept on the attempt row, and `StaleState` is raised.
        """
        await self.durable()
        changes: dict[str, Any] = outcome.changes()
        if not keep_claim or outcome.failure_class is not None:
            changes |= {"claim": None, "worker": None}
        taker = self.taker
        try:
            async with taker.pool.acquire() as conn, conn.transaction():
                # the task row first, then the attempt: the order of every writer of both
                task = await tasks_repo.transition(
                    conn,
                    self.task.id,
                    outcome.state,
                    among=frozenset({src}),
                    claim=self.claim,
                    changes=changes,
                    job_event=outcome.job_event(self.task.job_id, self.task.id),
                )
                await attempts_repo.finish(
                    conn,
                    self.task.id,
                    attempt,
                    outcome.state.value,
                    exit_code=outcome.exit_code,
                    signal=outcome.signal,
                    failure_class=outcome.failure_class,
                    error_brief=outcome.brief,
                    error_detail=outcome.detail,
                    status=status.model_dump(mode="json") if status else None,
                    detected_after_s=max(0.0, time.time() - since) if since else None,
                )
                if errors_of:
                    await job_errors_repo.record_from_logs(
                        conn, self.task.job_id, self.task.id, attempt, errors_of
                    )
                if outputs:
                    stored = await outputs_repo.save(
                        conn, self.task.id, self.task.run_number, taker.host_id, outputs
                    )
                    if stored:  # the owner's quota, last: its row is the last lock
                        what = f"the outputs of task {self.task.id}"
                        await quota_repo.charge_job(
                            conn, self.task.job_id, stored, store_quota_bytes, what
                        )
        except StaleState as exc:
            await self._record_late(attempt, outcome, str(exc))
            raise
        if outcome.state in QUIET:
            await taker.writer.nudge()
        self.task, self.state = task, outcome.state
        self._to(Hold.HELD)

    async def fail_unstarted(self, failure: Outcome) -> None:
        """Fail a task whose command will not start, from `queued`, with a cluster attempt
        that says why."""
        if self.unqueued:
            await self.queue()
        attempt = await self.start_attempt(Stage.CLUSTER.value)
        await self.finish(S.QUEUED, attempt, failure)

    async def _record_late(self, attempt: int, outcome: Outcome, why: str) -> None:
        """Keep the fenced-off report on its attempt row (best effort: it changes nothing)."""
        report = {
            "state": outcome.state.value,
            "failure_class": outcome.failure_class.value if outcome.failure_class else None,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "brief": outcome.brief,
            "rejected_because": why,
            "worker": self.taker.instance,
        }
        try:
            async with self.taker.pool.acquire() as conn:
                await attempts_repo.record_late_report(conn, self.task.id, attempt, report)
        except UNAVAILABLE as exc:
            logger.warning("could not record the late report of task %s: %s", self.task.id, exc)
        logger.warning(
            "task %s: late report rejected (%s)", self.task.id, why, extra={"task_id": self.task.id}
        )

    # -- letting go --------------------------------------------------------------------------

    async def release(self, state: TaskState) -> None:
        """Let go of a task that now waits (its claim returns to the scheduler)."""
        async with self.taker.pool.acquire() as conn:
            await self.give_back(conn, state)

    async def give_back(self, conn: Connection, state: TaskState) -> None:
        """Give the claim of the task resting in `state` back to the scheduler (no state
        change), in the caller's transaction."""
        await tasks_repo.give_back(conn, self.task.id, self.claim, state)

    async def fail(self, exc: BaseException, detail: str) -> None:
        """The worker hit an error of its own while driving the task: fail the task with it.

        Retried for a while, since the error may be the database itself restarting.
        """
        for _ in range(_FAIL_TRIES):
            try:
                async with self.taker.pool.acquire() as conn:
                    task = await tasks_repo.get(conn, self.task.id)
                    if task is None or task.claim != self.claim:
                        return
                    outcome = worker_failed(failure_state_for(task.state), exc, detail)
                    await loss.declare(conn, task, outcome)
                    return
            except UNAVAILABLE as db_error:
                logger.warning("cannot record the failure of %s yet: %s", self.task.id, db_error)
                await asyncio.sleep(_FAIL_PAUSE_S)

    async def abandon(self, why: str) -> None:
        """The worker is stopping with this task in its hands: fail it as lost."""
        await self.taker.lose(self.task.id, self.claim, why)
