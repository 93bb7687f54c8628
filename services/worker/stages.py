"""Driving one task through its stages on this host, fenced by its claim.

Once a task is taken (`claims.py`), `drive()` runs recovery/restart hooks and setup → cluster →
post-processing as far as the task can go without waiting. Every step is a
compare-and-set guarded by the claim: if anyone else moved the task (cancelled, declared lost),
the step fails with `StaleState` and the worker lets go, killing what it started.
"""

import asyncio
import functools
import logging
import signal
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from redis.asyncio import Redis

from services.worker import limits, process
from services.worker.claims import Held, Taker, release
from services.worker.confinement import Confinement
from services.worker.ledger import Hold, Ledger
from services.worker.log_shipper import LogShipper
from services.worker.settings import WorkerSettings
from shared.domain.bundle import BundleFile
from shared.domain.errors import UNAVAILABLE, StaleState
from shared.domain.messages import LogRecord, RunStage, Severity, WatchProcess
from shared.domain.outcomes import (
    Outcome,
    command_outcome,
    error_log_outcome,
    hook_failed,
    limit_outcome,
)
from shared.domain.policy import Policy
from shared.domain.states import ACTIONS, QUIET, FailureClass, Stage, TaskState
from shared.domain.status_report import StatusReport
from shared.host import bundle, job_files, marks
from shared.host.capacity import HostCapacity
from shared.host.cgroups import Cgroups, TaskLimits
from shared.host.processes import signal_tree
from shared.host.status_file import read_status, surely_absent
from shared.messaging.amqp import Broker
from shared.messaging.redis_keys import JOB_TTL_S, RedisKeys
from shared.messaging.topology import supervise_key
from shared.store import (
    attempts_repo,
    bundle_repo,
    job_errors_repo,
    jobs_repo,
    outputs_repo,
    tasks_repo,
    users_repo,
)
from shared.store.db import Connection, Pool
from shared.store.transition_writer import NUDGE_EVERY_S, Move, TransitionWriter
from shared.task_types import TaskContext, TaskType
from shared.task_types.base import HOOK_FOR_ACTION, OutputRecord

logger = logging.getLogger(__name__)
S = TaskState


class Releasable(Protocol):
    """Something held for the task that it gives back early (`consumer.Permit`)."""

    def release(self) -> None: ...


class _Suspended(Exception):
    """The job was suspended between setup and the command's start."""


def _dump(status: StatusReport | None) -> dict[str, Any] | None:
    return status.model_dump(mode="json") if status else None


def _failing_severities(held: Held, failing: LogRecord | None) -> list[Severity] | None:
    """The severities whose records are kept with the job when the task failed on its log."""
    if failing is None:
        return None
    return list(Policy.model_validate(held.job.policy).fail_on_log)


def _never_outcome(host_id: str, why: str) -> Outcome:
    """A task whose command can never start on its host (`Ledger.why_never`): the host's
    failure (class `host`), which triage may retry elsewhere."""
    brief = f"cannot run on host {host_id}: {why}"
    return Outcome(S.FAILED_ON_CLUSTER, FailureClass.HOST, brief=brief)


T = TypeVar("T")

#: How long reading a status file may take (off the event loop) before the task fails on it.
STATUS_READ_TIMEOUT_S: Final = 10.0


async def _read_status(ctx: TaskContext) -> StatusReport | None:
    """The run's status file, read in a thread: a job's file never blocks the event loop
    (`shared.host.status_file.read_status` refuses FIFOs, devices and links without waiting)."""
    if surely_absent(ctx.workdir, ctx.status_file):  # most commands write none: no thread hop
        return None
    try:
        async with asyncio.timeout(STATUS_READ_TIMEOUT_S):
            return await asyncio.to_thread(read_status, ctx.workdir, ctx.status_file)
    except TimeoutError:
        message = f"the status file could not be read within {STATUS_READ_TIMEOUT_S:g} s"
        return StatusReport(status="fatal", message=message)


@dataclass(frozen=True)
class _Ran:
    """A command that ran to its exit."""

    attempt: int
    returncode: int  # negative: killed by that signal
    failing: LogRecord | None  # its first line with a severity in `fail_on_log`
    exited_at: float | None
    status: StatusReport | None
    #: Its memory limit, if the kernel killed one of its processes for going over it.
    over_memory: TaskLimits | None = None
    #: The line bash wrote on stderr when it could not parse the script, if it wrote one.
    syntax_error: str | None = None


#: Running hook state -> its action state.
_HOOK_OF_RUNNING = {running: action for action, (running, _, _) in ACTIONS.items()}
_RESTARTS = frozenset({S.RESTART_SETUP, S.RESTART_CLUSTER, S.RESTART_POST_PROCESSING})
#: The hooks a type must run on the loop for its setups to fold their take (`StageRunner.take`).
_FOLDED_HOOKS = frozenset({"setup", "cluster_commands"})


@dataclass
class StageRunner:
    """Runs stages for the tasks of one worker instance."""

    settings: WorkerSettings
    pool: Pool
    broker: Broker
    redis: Redis
    keys: RedisKeys
    task_types: dict[str, TaskType]
    instance: str
    cgroups: Cgroups | None = None
    #: How jobs are confined (None: they run as the worker's user).
    confinement: Confinement | None = None
    #: The host's capacity (None: the settings', `WorkerSettings.capacity`).
    capacity: HostCapacity | None = None

    def __post_init__(self) -> None:
        #: The worker's moves of all its tasks, committed together when they overlap.
        self.writer = TransitionWriter(self.pool, nudge_every_s=NUDGE_EVERY_S)
        self.taker = Taker(
            self.pool,
            self.instance,
            self.settings.host_id,
            Path(self.settings.work_root),
            self.writer,
        )
        #: What the host's commands hold of its capacity: a command holds its job's request
        #: from its spawn to its exit (`ledger.Hold`); the bookkeeping around it (taking,
        #: setup, the work dir and cgroup made ready, the output drained, post-processing) holds
        #: nothing.
        self.ledger = Ledger(self.capacity or self.settings.capacity())
        self._pending: set[asyncio.Task[None]] = set()
        self._job_uids: dict[str, int] = {}  # owner -> users.job_uid (never changes)
        #: A task's memory limit when its job gives none (MiB; 0: none).
        self._memory_mb = limits.default_memory_mb(self.settings.job_memory_mb)

    async def take(self, message: RunStage) -> Held | None:
        """Make the message's claim this worker's; None when the message is stale (a no-op).

        A setup whose hooks run on the loop, with its request free, is not written here: its
        take rides on the `on_cpu` move (`_mark_on_cpu`), one commit for `new -> setting_up ->
        queued -> on_cpu`; any other path makes it durable first (`_taken`). A new task whose
        request this host can never hold is not taken: its claim goes back (`_never_here`)."""
        return await self.taker.take(message, fold=self._foldable, refuse=self._never_here)

    def _foldable(self, task: tasks_repo.Task, job: jobs_repo.Job) -> bool:
        """Whether a setup of `task` may fold its take into the `on_cpu` move: nothing it does
        before that move leaves the loop (its type's setup and cluster_commands are inline),
        and its request is free, so that the command is spawned at once."""
        task_type = self.task_types.get(job.type)
        return (
            task_type is not None
            and task_type.inline_hooks >= _FOLDED_HOOKS
            and self._fits(task, job)
            and not job.files  # placed in a thread (and fetched once per host)
        )

    def _never_here(self, task: tasks_repo.Task, job: jobs_repo.Job) -> str | None:
        """Why `task`'s command can never start on this host (None: it can, in its turn)."""
        return self.ledger.why_never(job.request, task.gpu_ids or ())

    async def _taken(self, held: Held) -> None:
        """Make a folded take durable before any other write of the task (StaleState if it
        is not ours any more)."""
        await self.taker.take_now(held)

    async def drive(self, held: Held, intake: Releasable | None = None) -> None:
        """Run the task from where it was taken as far as it can go. Never raises StaleState.

        `intake` is released as soon as the command exited (the rest needs no place)."""
        if held.job.type not in self.task_types:
            missing = LookupError(
                f"task type {held.job.type!r} is not installed on {self.instance}"
            )
            await self.taker.fail(held, missing, f"installed task types: {sorted(self.task_types)}")
            return
        try:
            if held.state in _HOOK_OF_RUNNING and not await self._hook(held):
                return
            if held.state is S.SETTING_UP and not await self._setup(held):
                return
            if held.state in (S.SETTING_UP, S.QUEUED) and not await self._cluster(held, intake):
                return
            await self._post_process(held)
        except StaleState as exc:
            logger.info("task %s moved on without us: %s", held.task.id, exc)
        except asyncio.CancelledError:
            if held.taken:  # else it is still `new`: its unacked message goes back
                await asyncio.shield(
                    self.taker.abandon(held, "the worker stopped while running it")
                )
            raise
        except Exception as exc:  # never leave a task held by a worker that gave up on it
            logger.exception("task %s: the worker failed while driving it", held.task.id)
            try:
                await self._taken(held)
            except StaleState:
                return
            await self.taker.fail(held, exc, traceback.format_exc())

    # -- recovery and restart hooks ----------------------------------------------------------

    async def _hook(self, held: Held) -> bool:
        """Run the hook of the task's action; True when the task goes on in this worker."""
        action = _HOOK_OF_RUNNING[held.state]
        _, ok_state, failed_state = ACTIONS[action]
        hook = HOOK_FOR_ACTION[action]
        attempt = await self._start_attempt(held, hook)
        ctx = self._context(held, attempt)
        _, failure = await self._run_hook(
            hook, failed_state, lambda: getattr(self._type(held), hook)(ctx)
        )
        if failure is not None:
            await self._end_hook(held, attempt, failure.state, failure, {})
            return False
        changes: dict[str, Any] = dict(tasks_repo.CLEAR_FAILURE)
        if action in _RESTARTS:
            changes["run_number"] = held.task.run_number + 1
        await self._end_hook(held, attempt, ok_state, None, changes)
        if ok_state is S.NEW:  # setup is dispatched again, to any worker of the pool
            await self.taker.release(held, S.NEW)
            return False
        return True

    async def _end_hook(
        self,
        held: Held,
        attempt: int,
        state: TaskState,
        failure: Outcome | None,
        changes: dict[str, Any],
    ) -> None:
        """Record the hook's attempt and move the task (its failure fields stay as they were)."""
        async with self.pool.acquire() as conn, conn.transaction():
            task = await tasks_repo.transition(
                conn,
                held.task.id,
                state,
                among=frozenset({held.state}),
                claim=held.claim,
                changes=changes if failure is None else {"claim": None, "worker": None},
            )
            await attempts_repo.finish(
                conn,
                held.task.id,
                attempt,
                state.value,
                failure_class=failure.failure_class if failure else None,
                error_brief=failure.brief if failure else None,
                error_detail=failure.detail if failure else None,
            )
        if state in QUIET:
            await self.writer.nudge()
        held.task, held.state = task, state

    # -- setup -------------------------------------------------------------------------------

    async def _setup(self, held: Held) -> bool:
        attempt = held.opened or await self._start_attempt(held, Stage.SETUP.value)
        held.opened = None
        ctx = self._context(held, attempt)
        contents = await self._bundle_contents(held)
        _, failure = await self._run_hook(
            "setup", S.FAILED_TO_SETUP, lambda: self._set_up(held, ctx, contents), held
        )
        if failure is not None:
            await self._finish(held, S.SETTING_UP, attempt, failure)
            return False
        held.set_up = attempt
        if not self._fits(
            held.task, held.job
        ):  # its request is not free: the task waits `queued` for it
            await self._queue(held)
        return True

    async def _bundle_contents(self, held: Held) -> dict[str, bytes] | None:
        """The bytes of the job's files when they are not on this host yet (None: it has no
        files, or they are here)."""
        work_root = Path(self.settings.work_root)
        if not held.job.files or bundle.on_host(work_root, held.job.id).is_dir():
            return None
        async with self.pool.acquire() as conn:
            return await bundle_repo.contents(conn, held.job.id)

    def _set_up(self, held: Held, ctx: TaskContext, contents: dict[str, bytes] | None) -> bool:
        """The job's files in the work dir, then its type's setup."""
        if held.job.files:
            files = [BundleFile.from_json(f) for f in held.job.files]
            work_root = Path(self.settings.work_root)
            bundle.place(work_root, held.job.id, files, contents, ctx.workdir)
        return self._type(held).setup(ctx)

    async def _queue(self, held: Held) -> None:
        """setting_up -> queued, closing the setup attempt (StaleState if not ours any more)."""
        attempt, held.set_up = held.set_up, None
        assert attempt is not None
        done = Outcome(S.QUEUED)
        moved = await self._advance(
            held, (S.SETTING_UP, S.QUEUED), done, close=tasks_repo.CloseAttempt(attempt)
        )
        if moved is None:  # not ours any more: the general path says why (and records it)
            await self._finish(held, S.SETTING_UP, attempt, done, keep_claim=True)

    # -- cluster -----------------------------------------------------------------------------

    async def _cluster(self, held: Held, intake: Releasable | None) -> bool:
        """Run the command with its request held (from its spawn to its exit); True when the
        task went on to data_ready (or post-processing)."""
        ran = await self._run_command(held)
        if intake is not None:
            intake.release()
        if ran is None:
            return False
        attempt, status = ran.attempt, ran.status
        outcome = command_outcome(ran.returncode, status, ran.syntax_error)
        if ran.failing is not None:  # the supervisor may have been slower than the exit
            outcome = error_log_outcome(
                ran.failing.severity.value, ran.failing.line, ran.returncode
            )
        if ran.over_memory is not None and ran.returncode != 0:  # the cause, whatever it logged
            outcome = limit_outcome(ran.returncode, ran.over_memory.memory_bytes)
        if outcome.state is S.DATA_READY:
            if self._results_are_saved(held, attempt, ran.returncode, status):
                moved = await self._advance(  # post-processing has nothing to do
                    held,
                    (S.ON_CPU, S.DATA_READY, S.POST_PROCESSING, S.COMPLETED),
                    outcome,
                    changes={"claim": None, "worker": None},
                    close=tasks_repo.CloseAttempt(attempt, _dump(status), outcome.exit_code),
                    open_=Stage.POST_PROCESSING,
                    open_done=True,
                    unless_waits="post_processing",
                )
                if moved is not None:
                    return False
            moved = await self._advance(
                held,
                (S.ON_CPU, S.DATA_READY, S.POST_PROCESSING),
                outcome,
                close=tasks_repo.CloseAttempt(attempt, _dump(status), outcome.exit_code),
                open_=Stage.POST_PROCESSING,
                unless_waits="post_processing",
            )
            if moved is not None:
                return True
        await self._finish(
            held,
            S.ON_CPU,
            attempt,
            outcome,
            keep_claim=True,
            status=status,
            errors_of=_failing_severities(held, ran.failing),
            since=ran.exited_at if outcome.failure_class is not None else None,
        )
        return outcome.state is S.DATA_READY

    async def _run_command(self, held: Held) -> _Ran | None:
        """Spawn the command held at its gate, make the task on_cpu, run it to its exit, or
        None when it did not run (its hook failed, the host can never hold its request, or the
        job was suspended meanwhile)."""
        never = self._never_here(held.task, held.job)
        if never is not None:  # taken before this worker was (restarted) smaller
            await self._fail_queued(held, _never_outcome(self.settings.host_id, never))
            return None
        # opened with on_cpu, numbered as the task's next (after the setup attempt of a take
        # folded into that move)
        attempt = held.task.attempt + (1 if held.taken else 2)
        ctx = self._context(held, attempt)
        script = await self._cluster_script(held, ctx)
        if script is None:
            return None
        # A diagnosis is about this attempt only.
        job_files.remove_file(ctx.workdir, ctx.status_file.relative_to(ctx.workdir))
        policy = Policy.model_validate(held.job.policy)
        settings = self.settings
        bounds = limits.resolve(
            policy.limits, held.job.request, self._memory_mb, settings.job_cpus, settings.job_pids
        )
        hold = self.ledger.hold(held.job.request, held.task.gpu_ids or ())
        running = await self._spawn_held(held, ctx, script, policy, bounds, hold)
        try:  # the gate opens once the process is in its cgroup and the task durably on_cpu
            _, on_cpu = await asyncio.gather(
                running.join_cgroup(), self._mark_on_cpu(held, attempt, running)
            )
            if not on_cpu:
                raise _Suspended
        except BaseException as exc:  # not ours any more (or we stop): never run the script
            running.close_gate()
            signal_tree(running.pid, running.create_time, running.cgroup, signal.SIGKILL)
            hold.free()
            await running.process.wait()
            if self.cgroups is not None:
                self.cgroups.remove(held.task.id, held.claim)
            if isinstance(exc, _Suspended):  # suspended since setup: given back unstarted
                await self.taker.release(held, S.QUEUED)
                return None
            raise
        running.open_gate()
        over_memory = None
        try:
            returncode, failing, syntax_error = await self._watch_output(
                held, attempt, ctx, running, policy, hold.free
            )
        finally:
            hold.free()
            if self.cgroups is not None:
                # what the kernel's counts tell matters only for a command that failed
                failed = running.process.returncode not in (None, 0)
                if failed and running.cgroup and self.cgroups.over_memory(held.task.id, held.claim):
                    over_memory = bounds
                self.cgroups.remove(held.task.id, held.claim)
        status = await _read_status(ctx)
        return _Ran(
            attempt, returncode, failing, running.exited_at, status, over_memory, syntax_error
        )

    async def _cluster_script(self, held: Held, ctx: TaskContext) -> str | None:
        """The command's script from its type's `cluster_commands`, or None when that hook
        failed (the task has then ended `failed_on_cluster`, or is retried)."""
        ctx.safe_mkdir(".vigil")
        script, failure = await self._run_hook(
            "cluster_commands",
            S.FAILED_ON_CLUSTER,
            lambda: self._type(held).cluster_commands(ctx),
            held,
        )
        if failure is None and isinstance(script, str):
            return script
        await self._fail_queued(
            held, failure or hook_failed(S.FAILED_ON_CLUSTER, "cluster_commands", None, None)
        )
        return None

    async def _fail_queued(self, held: Held, failure: Outcome) -> None:
        """Fail a task whose command will not start, from `queued`, with a cluster attempt
        that says why."""
        if held.set_up is not None:
            await self._queue(held)
        attempt = await self._start_attempt(held, Stage.CLUSTER.value)
        await self._finish(held, S.QUEUED, attempt, failure)

    async def _spawn_held(
        self,
        held: Held,
        ctx: TaskContext,
        script: str,
        policy: Policy,
        bounds: TaskLimits,
        hold: Hold,
    ) -> process.Running:
        """Make the command's cgroup and work dir ready, then take `hold` (its request) and
        spawn it, held at its gate until on_cpu is durable (on failure, the hold and cgroup are
        given back)."""
        cgroup, limiters = None, []
        if self.cgroups is not None:
            cgroup = self.cgroups.create(held.task.id, held.claim, bounds)
            limiters = self.cgroups.limiter_paths(held.task.id, held.claim) if cgroup else []
        try:
            prefix, hand_over = await self._confine(held, ctx, policy)
            await self._take_request(held, hold)
            env = (
                ctx.environment()
                | hold.environment()
                | {
                    "HOME": str(ctx.workdir),
                    marks.VARIABLE: marks.mark(
                        self.settings.namespace, self.settings.host_id, held.task.id, held.claim
                    ),
                }
            )
            return await process.spawn(
                script,
                ctx.workdir,
                env,
                cgroup,
                prefix=prefix,
                limiters=limiters,
                prepare=hand_over,
            )
        except BaseException:
            hold.free()
            if self.cgroups is not None:
                self.cgroups.remove(held.task.id, held.claim)
            raise

    async def _take_request(self, held: Held, hold: Hold) -> None:
        """Wait for the request of the command about to be spawned; a task just set up that
        must wait for it waits durably `queued` (as `_setup` makes it when it is not free
        then)."""
        if not self._fits(held.task, held.job) and held.set_up is not None:
            await self._queue(held)
        await hold.take()

    def _fits(self, task: tasks_repo.Task, job: jobs_repo.Job) -> bool:
        """Whether `task`'s command would start at once (`Ledger.fits`)."""
        return self.ledger.fits(job.request, task.gpu_ids or ())

    async def _confine(
        self, held: Held, ctx: TaskContext, policy: Policy
    ) -> tuple[list[str], Callable[[], None] | None]:
        """What the command is started through, and what gives the work dir to the job's uid
        (done in the spawn's thread, `process.spawn`)."""
        if self.confinement is None:
            return [], None
        owner = held.job.owner_id
        if owner not in self._job_uids:
            async with self.pool.acquire() as conn:
                self._job_uids[owner] = await users_repo.job_uid(conn, owner)
        job_uid = self._job_uids[owner]
        hand_over = functools.partial(
            self.confinement.hand_over, Path(self.settings.work_root), ctx.workdir, job_uid
        )
        return self.confinement.argv(job_uid, policy.network), hand_over

    async def _suspended(self, held: Held) -> bool:
        async with self.pool.acquire() as conn:
            return await jobs_repo.is_suspended(conn, held.job.id)

    async def _mark_on_cpu(self, held: Held, attempt: int, running: process.Running) -> bool:
        """queued -> on_cpu with the cluster attempt opened (number `attempt`, with its pid),
        then hand the process to the supervisor. A task just set up goes through `queued` in
        the same move, closing its setup attempt. False when the job was suspended since setup
        (the task is then `queued`); `StaleState` when the task is not ours any more."""
        set_up = held.set_up
        if not held.taken:  # the take, the setup attempt and on_cpu: one move, one commit
            moved = await self._advance(
                held,
                (S.NEW, S.SETTING_UP, S.QUEUED, S.ON_CPU),
                None,
                changes=self.taker.take_changes(held.task)
                | {"pid": running.pid, "pid_create_time": running.create_time},
                open_=Stage.CLUSTER,
                pid=running.pid,
                unless_suspended=True,
                first=tasks_repo.OpenAttempt(
                    Stage.SETUP.value,
                    self.settings.host_id,
                    self.instance,
                    done=True,
                    outcome=S.QUEUED,
                ),
            )
            if moved is None:  # take it the general way (or find out why not)...
                await self._taken(held)
                return await self._mark_on_cpu(held, attempt, running)  # ...and go on from there
            held.taken = True
            if held.on_taken is not None:
                await held.on_taken()
        else:
            moved = await self._advance(
                held,
                (S.SETTING_UP, S.QUEUED, S.ON_CPU) if set_up is not None else (S.QUEUED, S.ON_CPU),
                None,
                changes={"pid": running.pid, "pid_create_time": running.create_time},
                close=tasks_repo.CloseAttempt(set_up) if set_up is not None else None,
                open_=Stage.CLUSTER,
                pid=running.pid,
                unless_suspended=True,
            )
        if moved is None and set_up is not None:  # record `queued` (or find out why not)...
            await self._queue(held)
            return await self._mark_on_cpu(held, attempt, running)  # ...and try from there
        if moved is None:
            if await self._suspended(held):
                return False
            raise StaleState(f"task {held.task.id} is no longer queued under our claim")
        held.set_up = None
        if held.opened != attempt:  # the environment told the command another number
            raise RuntimeError(f"task {held.task.id}: opened attempt {held.opened}, not {attempt}")
        held.opened = None
        # Not awaited: the supervisor's periodic reconcile finds the process anyway, and every
        # verdict it reaches is fenced by the claim.
        self._background(self._hand_over(held, running))
        return True

    async def _hand_over(self, held: Held, running: process.Running) -> None:
        """Hand the process to the supervisor once it has run `follow_after_s`: one that
        exits sooner is seen to its end by this worker, its parent (what the supervisor
        would do for it: see `services/supervisor/watchers.py`), and costs no message."""
        await asyncio.sleep(self.settings.follow_after_s)
        if running.exited_at is not None:
            return
        watch = WatchProcess(
            job_id=held.task.job_id,
            task_id=held.task.id,
            claim=held.claim,
            pid=running.pid,
            create_time=running.create_time,
            ran_s=self.settings.follow_after_s,
        )
        try:
            await self.broker.publish_work(supervise_key(self.settings.host_id), watch)
        except Exception as exc:
            logger.warning("could not hand task %s to the supervisor: %s", watch.task_id, exc)

    async def background_done(self) -> None:
        """Wait for the runner's background work (the hand-overs to the supervisor)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _watch_output(
        self,
        held: Held,
        attempt: int,
        ctx: TaskContext,
        running: process.Running,
        policy: Policy,
        exited: Callable[[], None],
    ) -> tuple[int, LogRecord | None, str | None]:
        """Ship the output until the command exits: (its exit status, its first line with a
        severity in `fail_on_log`, the stderr line of a shell syntax error; each if any).
        `exited` is called as soon as the command's main process has ended, before its output
        is drained."""
        shipper = LogShipper(
            pool=self.pool,
            broker=self.broker,
            redis=self.redis,
            keys=self.keys,
            job_id=held.task.job_id,
            task_id=held.task.id,
            run_number=ctx.run_number,
            attempt=attempt,
            workdir=ctx.workdir,
            files={"stdout": ctx.run_file("stdout"), "stderr": ctx.run_file("stderr")},
            fail_on=frozenset(policy.fail_on_log),
            quota_bytes=self.settings.log_quota_bytes,
            flush_every_s=self.settings.log_flush_s,
        )
        try:
            note = self._exit_noter(held)

            async def on_exit(returncode: int) -> None:
                exited()
                await note(returncode)

            returncode = await process.wait(running, shipper.add, on_exit)
        finally:
            await shipper.close()
        return returncode, shipper.failing, shipper.syntax_error

    def _exit_noter(self, held: Held) -> process.ExitNote:
        """Notes every command's exit for the supervisor, handed over or not: its reconcile
        follows any task it finds `on_cpu`, and judges an exit it finds unnoted by its grace
        (a command whose many lines took longer to store than that was failed as `signal`:
        `docs/performance.md`, step 35, tried and dropped)."""

        async def note(returncode: int) -> None:
            try:
                key = self.keys.job_exits(held.task.job_id)
                async with self.redis.pipeline(transaction=False) as pipe:  # one round trip
                    pipe.hset(key, held.task.id, f"{held.claim} {returncode}")
                    pipe.expire(key, JOB_TTL_S)
                    await pipe.execute()
            except UNAVAILABLE as exc:  # the supervisor then judges by its grace
                logger.warning("could not note the exit of task %s: %s", held.task.id, exc)

        return note

    # -- post-processing ---------------------------------------------------------------------

    def _results_are_saved(
        self, held: Held, attempt: int, returncode: int, status: StatusReport | None
    ) -> bool:
        """Whether the task type says its `save_results` has nothing to do here (a hook that
        raises says no: the stage then runs and records why)."""
        ctx = self._context(held, attempt + 1)
        ctx.exit_code, ctx.status = returncode, status
        try:
            return self._type(held).results_are_saved(ctx)
        except Exception:
            logger.exception("results_are_saved of task %s raised", held.task.id)
            return False

    async def _post_process(self, held: Held) -> None:
        """Post-process now, or let go of the task if it waits for prerequisites first."""
        if held.state is S.POST_PROCESSING and held.opened is not None:
            attempt, held.opened = held.opened, None  # moved there with the cluster's end
        else:
            async with self.pool.acquire() as conn, conn.transaction():
                if await tasks_repo.waits_on_prerequisites(conn, held.task.id, "post_processing"):
                    await release(conn, held, S.DATA_READY)
                    return
                held.task = await tasks_repo.transition(
                    conn,
                    held.task.id,
                    S.POST_PROCESSING,
                    among=frozenset({S.DATA_READY}),
                    claim=held.claim,
                    changes={"worker": self.instance},
                )
                attempt = await self._open_attempt(conn, held, Stage.POST_PROCESSING.value)
            await self.writer.nudge()
            held.state = S.POST_PROCESSING
        ctx = self._context(held, attempt)
        ctx.exit_code = 0
        ctx.status = await _read_status(ctx)
        _, failure = await self._run_hook(
            "save_results", S.FAILED_TO_POST_PROCESS, lambda: self._type(held).save_results(ctx)
        )
        if failure is not None and failure.detail is None:  # returned False: an app failure
            brief = "save_results() returned False"
            if ctx.status is not None and ctx.status.status != "success":
                brief += f": status file says {ctx.status.status}: {ctx.status.message}"
            failure = Outcome(S.FAILED_ON_CLUSTER, FailureClass.EXIT, brief=brief)
        outcome = failure or Outcome(S.COMPLETED)
        outputs = list(ctx.recorded.values()) if failure is None else []
        if failure is None and not outputs:
            moved = await self._advance(
                held,
                (S.POST_PROCESSING, S.COMPLETED),
                outcome,
                changes={"claim": None, "worker": None},
                close=tasks_repo.CloseAttempt(attempt, _dump(ctx.status)),
            )
            if moved is not None:
                return
        await self._finish(
            held, S.POST_PROCESSING, attempt, outcome, status=ctx.status, outputs=outputs
        )

    # -- shared steps ------------------------------------------------------------------------

    def _type(self, held: Held) -> TaskType:
        return self.task_types[held.job.type]

    def _context(self, held: Held, attempt: int) -> TaskContext:
        task = held.task
        return TaskContext(
            job_id=task.job_id,
            task_id=task.id,
            index=task.index,
            input=held.input,
            workdir=self.taker.workdir(task.job_id, task.id),
            attempt=attempt,
            run_number=task.run_number,
            command=held.job.command,
            try_number=held.cluster_starts + 1,
            outputs=held.job.outputs,
            params=held.job.params,
            resume=task.resume,
            keep_bytes=self.settings.output_keep_bytes,
            keep_total_bytes=self.settings.output_keep_total_bytes,
            upstream=held.upstream,
        )

    async def _advance(
        self,
        held: Held,
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
        """A successful move in one statement (`tasks_repo.advance_statement`, committed with
        the moves of other tasks that overlap it); the task as it is now, or None when it did
        not match (the caller then takes its general path). A folded take is made durable
        first, unless this move is the one it rides on (`first`)."""
        if first is None:
            await self._taken(held)
        opening = (
            tasks_repo.OpenAttempt(
                open_.value,
                self.settings.host_id,
                self.instance,
                pid,
                done=open_done,  # ended with the move, with the status file closing the last
                status=close.status if open_done and close is not None else None,
            )
            if open_ is not None
            else None
        )
        sets = (outcome.changes() if outcome else {}) | (changes or {})
        moved = await self.writer.advance(
            Move(
                held.task,
                held.claim,
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
            held.task, held.state = moved, moved.state
            held.opened = moved.attempt if opening is not None else None
        return moved

    async def _start_attempt(self, held: Held, stage: str) -> int:
        await self._taken(held)
        async with self.pool.acquire() as conn, conn.transaction():
            return await self._open_attempt(conn, held, stage)

    async def _open_attempt(self, conn: Connection, held: Held, stage: str) -> int:
        """Open the task's next attempt (of `stage` or a hook) in the caller's transaction."""
        row = await attempts_repo.start(
            conn, held.task.id, held.claim, stage, host=self.settings.host_id, worker=self.instance
        )
        held.task = replace(held.task, attempt=row.attempt)
        return row.attempt

    async def _run_hook(
        self, hook: str, failed: TaskState, call: Callable[[], T], held: Held | None = None
    ) -> tuple[T | None, Outcome | None]:
        """Run a task type's hook in a thread (on the loop if the type of `held`'s job says
        it may: `TaskType.inline_hooks`): (its result, None), or (None, the failure).

        A hook that raises or returns something false fails; only a raise carries a detail.
        """
        # a chained task's setup may hash or copy its upstream outputs: never on the loop
        inline = (
            held is not None
            and hook in self._type(held).inline_hooks
            and not held.upstream
            and not held.job.files  # nor its files
        )
        try:
            result = call() if inline else await asyncio.to_thread(call)
        except Exception as exc:
            logger.warning("%s() raised", hook, exc_info=True)
            return None, hook_failed(failed, hook, exc, traceback.format_exc())
        return (result, None) if result else (None, hook_failed(failed, hook, None, None))

    async def _finish(
        self,
        held: Held,
        src: TaskState,
        attempt: int,
        outcome: Outcome,
        *,
        keep_claim: bool = False,
        status: StatusReport | None = None,
        outputs: list[OutputRecord] | None = None,
        errors_of: list[Severity] | None = None,
        since: float | None = None,
    ) -> None:
        """Close the attempt and move the task, in one transaction (fenced by the claim).

        `since`: when the failure happened (epoch seconds), for the detection latency.

        `errors_of`: the task failed on its error log; keep those records with the job.

        A failure is left for the scheduler's triage (recover, resubmit or give up). A report
        that comes too late (the task was declared lost, timed out, cancelled...) changes
        nothing; it is kept on the attempt row, and `StaleState` is raised.
        """
        await self._taken(held)
        changes: dict[str, Any] = outcome.changes()
        if not keep_claim or outcome.failure_class is not None:
            changes |= {"claim": None, "worker": None}
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                # the task row first, then the attempt: the order of every writer of both
                task = await tasks_repo.transition(
                    conn,
                    held.task.id,
                    outcome.state,
                    among=frozenset({src}),
                    claim=held.claim,
                    changes=changes,
                    job_event=outcome.job_event(held.task.job_id, held.task.id),
                )
                await attempts_repo.finish(
                    conn,
                    held.task.id,
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
                        conn, held.task.job_id, held.task.id, attempt, errors_of
                    )
                if outputs:
                    await outputs_repo.save(
                        conn, held.task.id, held.task.run_number, self.settings.host_id, outputs
                    )
        except StaleState as exc:
            await self._record_late(held, attempt, outcome, str(exc))
            raise
        if outcome.state in QUIET:
            await self.writer.nudge()
        held.task, held.state = task, outcome.state

    async def _record_late(self, held: Held, attempt: int, outcome: Outcome, why: str) -> None:
        """Keep the fenced-off report on its attempt row (best effort: it changes nothing)."""
        report = {
            "state": outcome.state.value,
            "failure_class": outcome.failure_class.value if outcome.failure_class else None,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "brief": outcome.brief,
            "rejected_because": why,
            "worker": self.instance,
        }
        try:
            async with self.pool.acquire() as conn:
                await attempts_repo.record_late_report(conn, held.task.id, attempt, report)
        except UNAVAILABLE as exc:
            logger.warning("could not record the late report of task %s: %s", held.task.id, exc)
        logger.warning(
            "task %s: late report rejected (%s)", held.task.id, why, extra={"task_id": held.task.id}
        )
