"""Taking tasks: the compare-and-set steps fenced by the claim that make one this worker's.

`take()` makes a work message's claim this worker's: setup and hooks move the task into their
running state (`setting_up`, `recovering_*`, `restarting_*`); the cluster and post-processing
stages adopt a task resting in `queued` / `data_ready`. After it the message can be acked: a
worker that dies from then on is the supervisor's business. `resume()` holds again a task this
worker holds but drives no more (the consumer's reconcile), where that is safe. What is taken
is a `tenure.Tenure`, which makes every move of the task from then on; `lose()` fails as lost
a task this worker holds without one.
"""

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from uuid import UUID

from services.worker.job_cache import JobCache
from services.worker.tenure import Hold, Tenure
from shared.domain.errors import StaleState
from shared.domain.messages import RunStage
from shared.domain.outputs import UpstreamOutput
from shared.domain.states import ACTIONS, QUIET, JobState, Stage, TaskState
from shared.operations import loss
from shared.operations.datasets import UPSTREAM_KEY
from shared.store import attempts_repo, jobs_repo, outputs_repo, tasks_repo
from shared.store.db import Connection, Pool
from shared.store.transition_writer import TransitionWriter

S = TaskState
logger = logging.getLogger(__name__)

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

#: The state a work message expects to find the task in, per stage.
_ENTRY_STATE = {
    Stage.SETUP: S.NEW,
    Stage.CLUSTER: S.QUEUED,
    Stage.POST_PROCESSING: S.DATA_READY,
}


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

    def workdir(self, job_id: str, task_id: str) -> Path:
        """Where a task's files live on this host."""
        return self.work_root / job_id / task_id

    async def take(
        self,
        message: RunStage,
        fold: Callable[[tasks_repo.Task, jobs_repo.Job], bool] | None = None,
        refuse: Callable[[tasks_repo.Task, jobs_repo.Job], str | None] | None = None,
    ) -> Tenure | None:
        """Make the message's claim this worker's; None when the message is stale (a no-op).

        With `fold` saying yes for the task, a setup is not written here: the task is held as
        it is, `taken` False, and its take rides on the move that makes it `on_cpu` (or, on any
        other path, is made durable first: `take_now`). With `refuse` saying why for a new
        task (this host can never run it), its claim is given back untaken, for the scheduler
        to place it again, and None returned.

        Setup and hooks move the task into their running state (`setting_up`, `recovering_*`,
        `restarting_*`); the cluster and post-processing stages adopt a resting task. Work of
        a job suspended since it was dispatched is given back unstarted (claim released, state
        unchanged): the scheduler dispatches it again once the job is resumed.

        The common case, a setup, is one statement that also opens the setup attempt; anything
        it does not match (suspended, stale, another stage) takes the general path. No pooled
        connection is held while the move waits for its commit: the writer needs one, and
        as many takes as the pool has connections would otherwise wait for each other for ever.
        """
        found = self._known(message) or await self._read(message)
        if found is None:
            return None
        task, job, cluster_starts = found
        if task.claim != message.claim or await self._refused(task, job, message, refuse):
            return None
        held: Tenure | None = None
        if (
            fold is not None
            and message.stage is Stage.SETUP
            and job.state is JobState.ACTIVE
            and task.state is S.NEW
            and not _promised(task.input)
            and fold(task, job)
        ):
            # the setup attempt it will open is numbered now: only this claim moves the counter
            held = Tenure(self, task, job, message.claim, S.SETTING_UP, task.input, Hold.PROMISED)
            held.carried = task.attempt + 1
        elif message.stage is Stage.SETUP and job.state is not JobState.SUSPENDED:
            taken = await self._take_setup(task, message.claim)
            if taken is not None:
                value: Any = task.input
                upstream: dict[str, UpstreamOutput] = {}
                if _promised(value):
                    async with self.pool.acquire() as conn:
                        value, upstream = await _resolve_input(
                            conn, value, job.owner_id, self.workdir(task.job_id, task.id)
                        )
                held = Tenure(
                    self,
                    taken,
                    job,
                    message.claim,
                    S.SETTING_UP,
                    value,
                    Hold.OPENED,
                    taken.attempt,
                    upstream=upstream,
                )
        if held is None:
            async with self.pool.acquire() as conn, conn.transaction():
                held = await self._take(conn, task, job, message)
            if held is not None and held.state in QUIET:
                await self.writer.nudge()
        if held is not None:
            held.cluster_starts = cluster_starts
        return held

    async def _read(self, message: RunStage) -> tuple[tasks_repo.Task, jobs_repo.Job, int] | None:
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
        (`RunStage.job`); else None: `take` reads them. What the claim left holds until the
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

    async def _refused(
        self,
        task: tasks_repo.Task,
        job: jobs_repo.Job,
        message: RunStage,
        refuse: Callable[[tasks_repo.Task, jobs_repo.Job], str | None] | None,
    ) -> bool:
        """Whether the setup of a new task was refused (`take`'s `refuse`): its claim given
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

    async def take_now(self, held: Tenure) -> None:
        """Make a folded take durable, as `take` would have (the setup attempt it opens gets
        the number `held` was given: the task's next, under the claim); StaleState when the
        task is not this claim's any more (a suspended job's claim given back meanwhile).
        Calls `held.on_taken` once it is."""
        if not held.promised:
            return
        taken = await self._take_setup(held.task, held.claim)
        if taken is None:  # the general path says why, and gives a suspended job's claim back
            message = RunStage(
                job_id=held.task.job_id, task_id=held.task.id, stage=Stage.SETUP, claim=held.claim
            )
            async with self.pool.acquire() as conn, conn.transaction():
                again = await self._take(conn, held.task, held.job, message)
            if again is None or again.state is not S.SETTING_UP:
                raise StaleState(f"task {held.task.id} is not ours to set up any more")
            taken = again.task
            await self.writer.nudge()
            async with self.pool.acquire() as conn:  # the general path opens no attempt
                row = await attempts_repo.start(
                    conn,
                    taken.id,
                    held.claim,
                    Stage.SETUP.value,
                    host=self.host_id,
                    worker=self.instance,
                )
            taken = replace(taken, attempt=row.attempt)
        await held.took(taken)

    def take_changes(self, task: tasks_repo.Task) -> dict[str, Any]:
        """What a take sets on the task: this worker, its host, the work dir."""
        return {
            "worker": self.instance,
            "host": self.host_id,
            "workdir": str(self.workdir(task.job_id, task.id)),
        }

    async def _take_setup(self, task: tasks_repo.Task, claim: UUID) -> tasks_repo.Task | None:
        """new -> setting_up with the setup attempt opened, unless the job is suspended."""
        return await self.writer.advance(
            tasks_repo.Advance(
                task,
                claim,
                (S.NEW, S.SETTING_UP),
                changes=self.take_changes(task),
                open_=tasks_repo.OpenAttempt(Stage.SETUP.value, self.host_id, self.instance),
                unless_suspended=True,
            )
        )

    async def _take(
        self, conn: Connection, task: tasks_repo.Task, job: jobs_repo.Job, message: RunStage
    ) -> Tenure | None:
        # Read again inside the transaction: after a refused setup move, the job may have been
        # suspended (or the task moved) since the first read.
        task = await tasks_repo.get(conn, message.task_id) or task
        job = await jobs_repo.get(conn, message.job_id, with_counts=False) or job
        if task.claim != message.claim:
            return None
        if job.state is JobState.SUSPENDED:
            await tasks_repo.give_back(conn, task.id, message.claim)
            return None
        try:
            state = await self._enter(conn, task, message)
        except StaleState:
            return None
        if state is None:
            return None
        return await self._held(conn, task, job, message.claim, state)

    async def _held(
        self,
        conn: Connection,
        task: tasks_repo.Task,
        job: jobs_repo.Job,
        claim: UUID,
        state: TaskState,
        opened: int | None = None,
    ) -> Tenure:
        """The task held under `claim` in `state`, its input resolved."""
        value, upstream = await _resolve_input(
            conn, task.input, job.owner_id, self.workdir(task.job_id, task.id)
        )
        hold = Hold.HELD if opened is None else Hold.OPENED
        return Tenure(self, task, job, claim, state, value, hold, opened, upstream=upstream)

    async def _enter(
        self, conn: Connection, task: tasks_repo.Task, message: RunStage
    ) -> TaskState | None:
        mine = {"worker": self.instance, "host": self.host_id}
        if message.stage is Stage.SETUP:
            workdir = str(self.workdir(task.job_id, task.id))
            await tasks_repo.transition(
                conn,
                task.id,
                S.SETTING_UP,
                among=frozenset({S.NEW}),
                claim=message.claim,
                changes=mine | {"workdir": workdir},
            )
            return S.SETTING_UP
        if message.stage is Stage.HOOK and task.state in ACTIONS:
            running = ACTIONS[task.state][0]
            await tasks_repo.transition(
                conn,
                task.id,
                running,
                among=frozenset({task.state}),
                claim=message.claim,
                changes=mine,
            )
            return running
        entry = _ENTRY_STATE.get(message.stage)
        if entry is not None and await tasks_repo.adopt(
            conn, task.id, entry, message.claim, self.instance
        ):
            return entry
        return None

    async def lose(self, task_id: str, claim: UUID, why: str) -> bool:
        """Fail the task as lost if this worker instance still holds it under `claim`."""
        async with self.pool.acquire() as conn:
            task = await tasks_repo.get(conn, task_id)
            if task is not None and task.claim == claim and task.worker == self.instance:
                return await loss.declare(conn, task, why=why)
        return False

    async def resume(self, task_id: str, job_id: str, claim: UUID) -> Tenure | None:
        """Hold again, to drive it, a task this worker instance holds in PostgreSQL under
        `claim` but drives no more (the reply of its take was lost after it committed, or its
        driver failed without recording why), as it rests, when no step after the take had
        started (`resumed_attempt`); None when it is not so held any more, or was further on.

        Safe only for a caller that no other handling of this claim can run beside (the
        consumer's reconcile: `services/worker/consumer.py`)."""
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
            held = await self._held(conn, task, job, claim, task.state, carried_on)
        held.cluster_starts = int(row["cluster_starts"])
        return held


def _task_and_job(row: Any) -> tuple[tasks_repo.Task, jobs_repo.Job]:
    """A row of `_TASK_AND_JOB` as the task and its job."""
    task = tasks_repo.Task.from_record({k: v for k, v in row.items() if k[:4] != "job."})
    job = jobs_repo.Job.from_record({k[4:]: v for k, v in row.items() if k[:4] == "job."})
    return task, job


#: States a take leads to (and `post_processing`), from which a worker that lost track of a
#: task it holds may drive it again, and the stage whose attempt may be open there: the one
#: the take (or the move into it) opened, none else.
_RESUMABLE: Final[dict[TaskState, str | None]] = {
    S.SETTING_UP: Stage.SETUP.value,  # a general take opens none: then `_setup` opens it
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


def _promised(value: Any) -> bool:
    """Whether an input is a promise of an upstream task's outputs: `{"upstream_task": id}`."""
    return isinstance(value, dict) and isinstance(value.get(UPSTREAM_KEY), str)


def _not_on_this_host(outputs: dict[str, UpstreamOutput], work_root: Path) -> list[str]:
    """The names of the outputs whose file is not here: not under this host's work root (made
    by another host), or gone (one stat each: cheap, never waits on the job: the paths are the
    workers' own record)."""
    return [
        name
        for name, output in outputs.items()
        if not Path(output.path).is_relative_to(work_root) or not os.path.lexists(output.path)
    ]


async def _resolve_input(
    conn: Connection, value: Any, owner_id: str, workdir: Path
) -> tuple[Any, dict[str, UpstreamOutput]]:
    """A promised input `{"upstream_task": id}` gets the upstream task's outputs: the input the
    command sees names them by their place in its own work dir (`workdir`), and the records say
    where they come from (their key in the store when the file is not on this host, else
    their kept bytes). Only if
    that task is of a job of the same owner (the api refuses any other; this is the last line):
    another user's outputs are never placed. Any `outputs` the input itself carried are
    replaced."""
    if not _promised(value):
        return value, {}
    upstream = value[UPSTREAM_KEY]
    of = await conn.fetchrow(
        "SELECT j.id, j.owner_id, j.purged_at FROM tasks t JOIN jobs j ON j.id = t.job_id"
        " WHERE t.id = $1",
        upstream,
    )
    owner = of["owner_id"] if of is not None else None
    if owner is not None and owner != owner_id:
        logger.warning("input names task %s of another owner: none of its outputs linked", upstream)
    records = await outputs_repo.latest(conn, upstream) if owner == owner_id else {}
    found = {
        name: UpstreamOutput(upstream, name, r["path"], r["host"], r["size"], r["sha256"])
        for name, r in records.items()
    }
    away = _not_on_this_host(found, workdir.parent.parent)  # <work root>/<job>/<task>
    purged = (
        f"job {of['id']} was purged at {of['purged_at']:%Y-%m-%d %H:%M:%S %Z}"
        if of is not None and of["purged_at"] is not None
        else None
    )
    stored = {n: records[n]["object_key"] for n in away if records[n]["object_key"]}
    if stored and purged is None:  # from another host: from the store, through its cache
        found |= {name: replace(found[name], object_key=key) for name, key in stored.items()}
        away = [name for name in away if name not in stored]
    if away:  # from another host, or purged: the bytes kept in the database, if they were
        kept = await outputs_repo.kept(conn, upstream, away)
        for name in away:
            why = purged or records[name]["not_kept"]
            found[name] = replace(found[name], content=kept.get(name), not_kept=why)
    local = {name: str(workdir / name) for name in found}
    return {**value, "outputs": local}, found
