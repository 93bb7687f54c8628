"""The claims this worker holds: who holds them (`Taker`: this worker instance, its pool,
move writer and work root), which work deliveries it has in hand, what a work message's claim
names (its task and job, read or known), and where a held task stands beside its state in
PostgreSQL (`Hold`, with the moves between stands and from where a task held but driven by none
may be driven again). A held task's moves, its take first, are its `tenure.Tenure`'s.

The jobs a worker has read are kept by their row version (`JobCache`). A work message from
the planning round carries its task's row as the claim left it and its job's row version then
(`jobs.xmin`, which every update of the row changes: a state, an edit, a probe). A worker that
read that job at that version already has what a take would read:
its take (`Taker.read`) then reads nothing, and a big job's tasks cost PostgreSQL one
statement fewer each. A job at another version (changed since, or a message older than what
was read) is read again, as is a job the cache no longer holds.
"""

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from shared.domain.errors import StaleState
from shared.domain.messages import RunStage
from shared.domain.states import ACTIONS, QUIET, JobState, Stage, TaskState
from shared.operations import loss
from shared.store import attempts_repo, jobs_repo, tasks_repo
from shared.store.db import Connection, Pool
from shared.store.transition_writer import TransitionWriter

S = TaskState
logger = logging.getLogger(__name__)

#: An acknowledgement of the work message that brought a task (once).
Ack = Callable[[], Awaitable[None]]

#: The state a work message expects to find the task in, per stage, for a take that adopts it.
_ENTRY_STATE: Final = {Stage.CLUSTER: S.QUEUED, Stage.POST_PROCESSING: S.DATA_READY}

#: A message's task and its job in one read (the job's columns prefixed `job.`).
#: How many times this input's cluster stage started before: over the task and the tasks it
#: was resubmitted from (`VIGIL_TRY` is one more). Each step of the lineage and each count is
#: an index probe (the correlated subqueries keep the planner from scanning either table).
_CLUSTER_STARTS: Final = """
(WITH RECURSIVE line(id) AS (
    SELECT t.id
    UNION ALL
    SELECT (SELECT p.resubmitted_from FROM tasks p WHERE p.id = line.id)
    FROM line WHERE line.id IS NOT NULL)
 SELECT coalesce(sum((SELECT count(*) FROM attempts a
                      WHERE a.task_id = line.id AND a.stage = 'cluster')), 0)
 FROM line WHERE line.id IS NOT NULL) AS cluster_starts"""

_TASK_AND_JOB: Final = (
    "SELECT t.*, "
    + ", ".join(f'j.{column} AS "job.{column}"' for column in jobs_repo.COLUMNS)
    + ", j.xmin::text::bigint AS job_version"  # what the planning round's claim reads too
    + f", {_CLUSTER_STARTS}"
    + " FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.id = $1 AND j.id = $2"
)


class Hold(StrEnum):
    """Where a held task stands in this worker beside its state in PostgreSQL: what the
    task's next move carries along (`Tenure.carried`, an attempt's number)."""

    #: In hand by its work message only, not acked: its take is not written yet (a setup's
    #: may ride on the `on_cpu` move: the task is still `new` in PostgreSQL, and its take,
    #: when written, opens the setup attempt numbered `carried`).
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
    Hold.PROMISED: frozenset({Hold.PROMISED_SET_UP, Hold.OPENED, Hold.HELD}),  # set up; taken
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


#: States a take leads to (and `post_processing`), from which a worker that lost track of a
#: task it holds may drive it again, and the stage whose attempt may be open there: the one
#: the take (or the move into it) opened, none else.
_RESUMABLE: Final[dict[TaskState, str | None]] = {
    S.SETTING_UP: Stage.SETUP.value,  # none: the take's move failed after it committed
    S.QUEUED: None,
    S.DATA_READY: None,
    S.POST_PROCESSING: Stage.POST_PROCESSING.value,
    **{running: None for running, _ok, _failed in ACTIONS.values()},
}


def resumed_attempt(
    state: TaskState, opened: list[tuple[int, str]], latest: int
) -> tuple[bool, int | None]:
    """Whether a held task that nobody drives may be driven again from `state`, its open
    attempts being `opened` ((number, stage)) and its latest attempt `latest`, and the
    attempt it carries on (None: its stage opens one). Not when a command may have run
    (`on_cpu`), nor when a step after the take had started (another attempt is open).

    Running again what a take leads to is what a task type's hooks are written for: a stage
    cut off is run again in the same work dir (`docs/how-to/task-types.md`); a command never is."""
    if state not in _RESUMABLE:
        return False, None
    stage = _RESUMABLE[state]
    if not opened:  # post-processing opens its attempt with the move into it
        return state is not S.POST_PROCESSING, None
    if stage is not None and opened == [(latest, stage)]:
        return True, latest
    return False, None


#: Jobs kept at most (the least recently used go first): a host runs the tasks of a few
#: jobs at a time.
MOST_JOBS: Final = 256


class JobCache:
    """Jobs by id, each at the row version it was read at: a take of a task of a known job
    reads nothing (the module doc)."""

    def __init__(self, most: int = MOST_JOBS) -> None:
        self._most = most
        self._jobs: OrderedDict[str, tuple[int, jobs_repo.Job]] = OrderedDict()
        #: Jobs found at their version, for benchmarks and tests.
        self.hits = 0

    def get(self, job_id: str, version: int) -> jobs_repo.Job | None:
        """The job as read at `version`, or None (not read, or read at another version)."""
        kept = self._jobs.get(job_id)
        if kept is None or kept[0] != version:
            return None
        self._jobs.move_to_end(job_id)
        self.hits += 1
        return kept[1]

    def keep(self, job: jobs_repo.Job, version: int) -> None:
        """Remember `job` as read at `version`."""
        self._jobs[job.id] = (version, job)
        self._jobs.move_to_end(job.id)
        while len(self._jobs) > self._most:
            self._jobs.popitem(last=False)


@dataclass(frozen=True)
class Resting:
    """A task this worker instance holds but drives no more, as it rests (`Taker.resting`)."""

    task: tasks_repo.Task
    job: jobs_repo.Job
    carried: int | None  # the attempt it carries on (None: its stage opens one)
    cluster_starts: int


@dataclass(frozen=True)
class Taken:
    """A take written: the task as it is now, its job, the state it entered, and the attempt
    it opened (None: none)."""

    task: tasks_repo.Task
    job: jobs_repo.Job
    state: TaskState
    opened: int | None


@dataclass(frozen=True)
class Taker:
    """Who takes: this worker instance on this host, with its work root."""

    pool: Pool
    instance: str
    host_id: str
    work_root: Path
    writer: TransitionWriter
    #: The jobs read by takes, by row version (a take of a known job's task reads nothing).
    jobs: JobCache = field(default_factory=JobCache)
    #: The (task, claim) of every work message this worker is handling, and of every task its
    #: reconcile drives again: the broker delivers a message again when its ack was lost (a
    #: channel that closed), and a second handling of the same claim must never start a
    #: second run of its task.
    in_hand: set[tuple[str, UUID]] = field(default_factory=set)

    def workdir(self, job_id: str, task_id: str) -> Path:
        """Where a task's files live on this host."""
        return self.work_root / job_id / task_id

    def take_changes(self, task: tasks_repo.Task) -> dict[str, Any]:
        """What a take sets on the task: this worker, its host, the work dir."""
        workdir = str(self.workdir(task.job_id, task.id))
        return {"worker": self.instance, "host": self.host_id, "workdir": workdir}

    # -- deliveries in hand ------------------------------------------------------------------

    async def received(self, message: RunStage, ack: Ack) -> bool:
        """Whether `message` is the only delivery of its claim in hand, now taken in hand
        until `let_go`; a delivery again of one in hand is acked and dropped (the task is
        already ours)."""
        if self.hand(message.task_id, message.claim):
            return True
        logger.warning("task %s: its work message came again; already ours", message.task_id)
        await ack()
        return False

    def hand(self, task_id: str, claim: UUID) -> bool:
        """Take the task's `claim` in hand; False when it is already."""
        if (task_id, claim) in self.in_hand:
            return False
        self.in_hand.add((task_id, claim))
        return True

    def let_go(self, task_id: str, claim: UUID) -> None:
        self.in_hand.discard((task_id, claim))

    # -- what a claim names ------------------------------------------------------------------

    async def claimed(
        self,
        message: RunStage,
        refuse: Callable[[tasks_repo.Task, jobs_repo.Job], str | None] | None,
    ) -> tuple[tasks_repo.Task, jobs_repo.Job, int] | None:
        """What the message's claim names (`read`) while it is still the task's and its setup
        is not refused (`refused`); None otherwise."""
        found = await self.read(message)
        if found is None or found[0].claim != message.claim:
            return None
        return None if await self.refused(found[0], found[1], message, refuse) else found

    async def read(self, message: RunStage) -> tuple[tasks_repo.Task, jobs_repo.Job, int] | None:
        """The message's task, its job and its input's cluster starts before: known from the
        message (`_known`) or read; None when there is no such task."""
        return self._known(message) or await self._read_rows(message)

    async def _read_rows(
        self, message: RunStage
    ) -> tuple[tasks_repo.Task, jobs_repo.Job, int] | None:
        """The message's task, its job (kept, by its version) and its input's cluster starts
        before, as they are now; None when there is no such task."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(_TASK_AND_JOB, message.task_id, message.job_id)
        if row is None:
            return None
        task, job = _task_and_job(row)
        self.jobs.keep(job, int(row["job_version"]))
        return task, job, int(row["cluster_starts"])

    def _known(self, message: RunStage) -> tuple[tasks_repo.Task, jobs_repo.Job, int] | None:
        """The message's task as claimed, its job, and its input's cluster starts before
        (none: a task on its first attempt, resubmitted from none), when the message says
        all of it (`RunStage.claimed`, `job_version`: the planning round's claims) and this
        worker read its job at that version (`JobCache`), or the message carries the job
        (`RunStage.job`); else None: `read` reads them. What the claim left holds until the
        claim changes, and every move is fenced by it."""
        if message.claimed is None or message.job_version is None:
            return None
        try:
            if message.job is not None:
                self.jobs.keep(jobs_repo.Job.from_json(message.job), message.job_version)
            task = tasks_repo.Task.from_json(message.claimed)
        except (KeyError, ValueError, TypeError):  # not what a claim writes: read instead
            logger.warning("work message for task %s: its rows unreadable", message.task_id)
            return None
        if task.attempt or task.resubmitted_from is not None:
            return None  # its cluster starts are counted over its attempts and lineage
        job = self.jobs.get(message.job_id, message.job_version)
        if job is None or task.id != message.task_id or task.job_id != job.id:
            return None
        return task, job, 0

    async def refused(
        self,
        task: tasks_repo.Task,
        job: jobs_repo.Job,
        message: RunStage,
        refuse: Callable[[tasks_repo.Task, jobs_repo.Job], str | None] | None,
    ) -> bool:
        """Whether the setup of a new task was refused (`refuse`): its claim given
        back, if it was still new under it."""
        if refuse is None or message.stage is not Stage.SETUP or task.state is not S.NEW:
            return False
        why = refuse(task, job)
        if why is None:
            return False
        logger.warning("task %s given back untaken: %s", task.id, why, extra={"task_id": task.id})
        async with self.pool.acquire() as conn:
            await tasks_repo.give_back(conn, task.id, message.claim, S.NEW)
        return True

    # -- the take's writes -------------------------------------------------------------------

    async def write_take(
        self, task: tasks_repo.Task, job: jobs_repo.Job, claim: UUID, stage: Stage
    ) -> Taken | None:
        """Make `claim` this worker's for a work message of `stage`; None when the claim is
        not the task's any more (then nothing is written).

        Setup and hooks move the task into their running state (`setting_up`, `recovering_*`,
        `restarting_*`), a setup opening its attempt; the cluster and post-processing stages
        adopt a resting task. Work of a job suspended since it was dispatched is given back
        unstarted (claim released, state unchanged): the scheduler dispatches it again once
        the job is resumed. The common case, a setup, is one statement; anything it does not
        match (suspended, stale, another stage) takes the general path. No pooled connection
        is held while the move waits for its commit: the writer needs one, and as many takes
        as the pool has connections would otherwise wait for each other for ever."""
        if stage is Stage.SETUP and job.state is not JobState.SUSPENDED:
            taken = await self.writer.advance(
                tasks_repo.Steps(
                    (S.NEW, S.SETTING_UP),
                    changes=self.take_changes(task),
                    open_=tasks_repo.OpenAttempt(Stage.SETUP.value, self.host_id, self.instance),
                    unless_suspended=True,
                ).of(task, claim)
            )
            if taken is not None:
                return Taken(taken, job, S.SETTING_UP, taken.attempt)
        async with self.pool.acquire() as conn, conn.transaction():
            general = await self._take_general(conn, task, job, claim, stage)
        if general is not None and general.state in QUIET:
            await self.writer.nudge()
        return general

    async def _take_general(
        self,
        conn: Connection,
        task: tasks_repo.Task,
        job: jobs_repo.Job,
        claim: UUID,
        stage: Stage,
    ) -> Taken | None:
        """The take the general way, in the caller's transaction."""
        # Read again inside the transaction: after a refused setup move, the job may have been
        # suspended (or the task moved) since the first read.
        task = await tasks_repo.get(conn, task.id) or task
        job = await jobs_repo.get(conn, job.id, with_counts=False) or job
        if task.claim != claim:
            return None
        if job.state is JobState.SUSPENDED:
            await tasks_repo.give_back(conn, task.id, claim)
            return None
        try:
            entered = await self._enter(conn, task, claim, stage)
        except StaleState:
            return None
        return None if entered is None else Taken(entered[0], job, entered[1], entered[2])

    async def _enter(
        self, conn: Connection, task: tasks_repo.Task, claim: UUID, stage: Stage
    ) -> tuple[tasks_repo.Task, TaskState, int | None] | None:
        """The take's move into the stage's state (or its adoption of the task resting there):
        the task, the state, and the attempt opened (a setup's)."""
        if stage is Stage.SETUP:
            changes = self.take_changes(task)
            await tasks_repo.transition(
                conn, task.id, S.SETTING_UP, among=frozenset({S.NEW}), claim=claim, changes=changes
            )
            row = await attempts_repo.start(
                conn, task.id, claim, stage.value, host=self.host_id, worker=self.instance
            )
            return replace(task, attempt=row.attempt), S.SETTING_UP, row.attempt
        if stage is Stage.HOOK and task.state in ACTIONS:
            running = ACTIONS[task.state][0]
            mine = {"worker": self.instance, "host": self.host_id}
            await tasks_repo.transition(
                conn, task.id, running, among=frozenset({task.state}), claim=claim, changes=mine
            )
            return task, running, None
        entry = _ENTRY_STATE.get(stage)
        if entry is not None and await tasks_repo.adopt(conn, task.id, entry, claim, self.instance):
            return task, entry, None
        return None

    async def lose(self, task_id: str, claim: UUID, why: str) -> bool:
        """Fail the task as lost if this worker instance still holds it under `claim`."""
        async with self.pool.acquire() as conn:
            task = await tasks_repo.get(conn, task_id)
            if task is not None and task.claim == claim and task.worker == self.instance:
                return await loss.declare(conn, task, why=why)
        return False

    async def resting(self, task_id: str, job_id: str, claim: UUID) -> Resting | None:
        """A task this worker instance holds in PostgreSQL under `claim` but drives no more
        (the reply of its take was lost after it committed, or its driver failed without
        recording why), as it rests, when it may be driven again from there
        (`resumed_attempt`: no step after the take had started); None when it is not so held
        any more, or was further on. Its row stays locked while it is read."""
        async with self.pool.acquire() as conn, conn.transaction():
            if not await tasks_repo.lock_held(conn, task_id, claim, self.instance):
                return None
            row = await conn.fetchrow(_TASK_AND_JOB, task_id, job_id)
            if row is None:
                return None
            task, job = _task_and_job(row)
            attempts = await attempts_repo.list_for_task(conn, task_id)
        opened = [(a.attempt, a.stage) for a in attempts if a.ended_at is None]
        resumable, carried_on = resumed_attempt(task.state, opened, task.attempt)
        if not resumable:
            return None
        return Resting(task, job, carried_on, int(row["cluster_starts"]))


def _task_and_job(row: Any) -> tuple[tasks_repo.Task, jobs_repo.Job]:
    """A row of `_TASK_AND_JOB` as the task and its job."""
    task = tasks_repo.Task.from_record({k: v for k, v in row.items() if k[:4] != "job."})
    job = jobs_repo.Job.from_record({k[4:]: v for k, v in row.items() if k[:4] == "job."})
    return task, job
