"""A task this worker holds, from its take to its finish, and every move it makes under its
claim, the take first (the held task's one owner in the worker).

A `Tenure` is made for a work message (`taking`); it writes its take (the writes are
`claims.Taker`'s) or, for a setup folded into the `on_cpu` move, holds it promised
(`claims.Hold`) until that move or any other write, and acks its message once the take is
written or found stale. The stage machine (`stages.py`, `runs.py`) then asks it for each step
(`advance`: one statement, batched with other tasks' moves; `finish`: the attempt closed and
the task moved in one transaction; `on_cpu`, `queue`, `release`, `fail`, `abandon`). Each is
a compare-and-set fenced by the claim: if anyone else moved the task, it fails with
`StaleState` (or changes nothing), and the worker lets go.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final
from uuid import UUID

from services.worker.claims import PROMISES, Ack, Hold, Taker, check_hold
from services.worker.stage_in import promised_input, resolve_input
from shared.domain.errors import UNAVAILABLE, StaleState
from shared.domain.messages import RunStage, Severity
from shared.domain.outcomes import Outcome, worker_failed
from shared.domain.outputs import UpstreamOutput
from shared.domain.states import QUIET, JobState, Stage, TaskState, failure_state_for
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
from shared.store.db import Connection
from shared.task_types.base import OutputRecord

S = TaskState
logger = logging.getLogger(__name__)

_FAIL_TRIES: Final = 30
_FAIL_PAUSE_S: Final = 1.0


@dataclass
class Tenure:
    """A task this worker holds: the row as it was taken, its job, and the claim."""

    #: Who holds it (this worker instance on this host): its pool, writer and ids.
    taker: Taker
    task: tasks_repo.Task
    job: jobs_repo.Job
    claim: UUID
    state: TaskState
    input: Any = None  # the task's input, a chained one resolved to its upstream outputs
    #: Where it stands in this worker (`Hold`), and the attempt that carries along.
    hold: Hold = Hold.PROMISED
    carried: int | None = None
    #: How many times the input's cluster stage started before this take (its lineage too).
    cluster_starts: int = 0
    #: Acks the work message it came by (once): when its take is written, or found stale.
    ack: Ack | None = None
    #: A chained task's upstream outputs, by name (what setup places in its work dir).
    upstream: dict[str, UpstreamOutput] = field(default_factory=dict)

    def _to(self, hold: Hold, carried: int | None = None) -> None:
        check_hold(self.hold, hold)
        self.hold, self.carried = hold, carried

    @property
    def promised(self) -> bool:
        """Whether its take is not written yet."""
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

    async def _acked(self) -> None:
        if self.ack is not None:
            await self.ack()

    # -- the take ----------------------------------------------------------------------------

    @classmethod
    async def taking(
        cls,
        taker: Taker,
        message: RunStage,
        ack: Ack | None = None,
        fold: Callable[[tasks_repo.Task, jobs_repo.Job], bool] | None = None,
        refuse: Callable[[tasks_repo.Task, jobs_repo.Job], str | None] | None = None,
    ) -> "Tenure | None":
        """The message's task taken (`take`); None, its message acked, when it is stale.

        With `fold` saying yes for a new task of an active job, its take is not written here:
        it is held promised, and its take rides on the move that makes it `on_cpu` (or, on
        any other path, is written first: `durable`). With `refuse` saying why for a new task
        (this host can never run it), its claim is given back untaken, for the scheduler to
        place it again, and None returned."""
        found = await taker.claimed(message, refuse)
        if found is None:
            if ack is not None:
                await ack()
            return None
        task, job, cluster_starts = found
        folded = (
            fold is not None
            and message.stage is Stage.SETUP
            and job.state is JobState.ACTIVE
            and task.state is S.NEW
            and not promised_input(task.input)
            and fold(task, job)
        )
        # a folded take's setup attempt is numbered now: only this claim moves the counter
        carried = task.attempt + 1 if folded else None
        state = S.SETTING_UP if folded else task.state
        held = cls(taker, task, job, message.claim, state, task.input, Hold.PROMISED, carried)
        held.cluster_starts, held.ack = cluster_starts, ack
        if not folded and not await held.take(message.stage):
            return None
        await held._resolve()
        return held

    @classmethod
    async def resuming(
        cls, taker: Taker, task_id: str, job_id: str, claim: UUID
    ) -> "Tenure | None":
        """Hold again, to drive it, a task this worker instance holds under `claim` but drives
        no more, as it rests (`Taker.resting`); None when it is not so held any more, or not
        safe to drive again. Safe only for a caller that no other handling of this claim can
        run beside (the consumer's reconcile, the claim in hand: `Taker.hand`)."""
        resting = await taker.resting(task_id, job_id, claim)
        if resting is None:
            return None
        task, carried = resting.task, resting.carried
        hold = Hold.HELD if carried is None else Hold.OPENED
        held = cls(taker, task, resting.job, claim, task.state, task.input, hold, carried)
        held.cluster_starts = resting.cluster_starts
        await held._resolve()
        return held

    async def _resolve(self) -> None:
        """A chained input resolved to its upstream outputs (`stage_in.resolve_input`)."""
        if promised_input(self.task.input):
            workdir = self.taker.workdir(self.task.job_id, self.task.id)
            async with self.taker.pool.acquire() as conn:
                self.input, self.upstream = await resolve_input(
                    conn, self.task.input, self.job.owner_id, workdir
                )

    async def take(self, stage: Stage) -> bool:
        """Write its take, its claim made this worker's for `stage` (`Taker.write_take`);
        False, its message acked as stale, when the claim is not the task's any more."""
        taken = await self.taker.write_take(self.task, self.job, self.claim, stage)
        if taken is None:
            await self._acked()
            return False
        self.task, self.job, self.state = taken.task, taken.job, taken.state
        if self.hold is Hold.PROMISED_SET_UP:
            self._to(Hold.SET_UP, self.carried)
        else:
            self._to(Hold.HELD if taken.opened is None else Hold.OPENED, taken.opened)
        await self._acked()
        return True

    async def durable(self) -> None:
        """Write a promised take before any other write of the task (StaleState if it is not
        ours any more)."""
        if self.promised and not await self.take(Stage.SETUP):
            raise StaleState(f"task {self.task.id} is not ours to set up any more")

    # -- moves -------------------------------------------------------------------------------

    async def advance(self, move: tasks_repo.Steps) -> tasks_repo.Task | None:
        """A successful move in one statement (`move` of this task under its claim, committed
        with the moves of other tasks that overlap it); the task as it is now, or None when it
        did not match (the caller then takes its general path). A promised take is written
        first, unless this move is the one it rides on (`first`)."""
        if move.first is None:
            await self.durable()
        moved = await self.taker.writer.advance(move.of(self.task, self.claim))
        if moved is not None:
            self.task, self.state = moved, moved.state
            if move.open_ is not None and not move.open_.done:
                self._to(Hold.OPENED, moved.attempt)
            else:
                self._to(Hold.HELD)
        return moved

    def opening(
        self, stage: Stage, pid: int | None = None, done: bool = False, status: Any = None
    ) -> tasks_repo.OpenAttempt:
        """The attempt of `stage` a move opens on this worker (`done`: ended by the move, its
        status file `status`)."""
        taker = self.taker
        return tasks_repo.OpenAttempt(
            stage.value, taker.host_id, taker.instance, pid, done=done, status=status
        )

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
                tasks_repo.Steps(
                    (S.NEW, S.SETTING_UP, S.QUEUED, S.ON_CPU),
                    changes=taker.take_changes(self.task) | running,
                    open_=self.opening(Stage.CLUSTER, pid),
                    unless_suspended=True,
                    first=replace(self.opening(Stage.SETUP, done=True), outcome=S.QUEUED),
                )
            )
            if moved is not None:
                await self._acked()
            return moved
        set_up = self.carried if self.hold is Hold.SET_UP else None
        return await self.advance(
            tasks_repo.Steps(
                (S.SETTING_UP, S.QUEUED, S.ON_CPU) if set_up is not None else (S.QUEUED, S.ON_CPU),
                changes=running,
                close=tasks_repo.CloseAttempt(set_up) if set_up is not None else None,
                open_=self.opening(Stage.CLUSTER, pid),
                unless_suspended=True,
            )
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
        close = tasks_repo.CloseAttempt(attempt)
        moved = await self.advance(
            tasks_repo.Steps((S.SETTING_UP, S.QUEUED), changes=done.changes(), close=close)
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
