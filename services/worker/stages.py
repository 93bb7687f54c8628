"""The stage machine: one task driven through its stages on this host, fenced by its claim.

Once a task is taken (a `tenure.Tenure`), `drive()` runs recovery/restart hooks
and setup → cluster → post-processing as far as the task can go without waiting: the task
type's hooks, and what their results mean. Every move is the tenure's, a compare-and-set
guarded by the claim: if anyone else moved the task (cancelled, declared lost), the step fails
with `StaleState` and the worker lets go, killing what it started. The cluster stage's command
runs through `runs.py` (its request of the host, its start by the worker's launcher,
`launch.py`, its output and its exit).
"""

import asyncio
import logging
import signal
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from redis.asyncio import Redis

from services.worker.claims import Ack, Taker
from services.worker.host_store import HostStore
from services.worker.launch import Launcher, LocalConfined, LocalUnconfined
from services.worker.ledger import Ledger
from services.worker.runs import Ran, Runs, read_status
from services.worker.settings import WorkerSettings
from services.worker.stage_in import StageIn, bundle_contents
from services.worker.stage_out import StageOut
from services.worker.tenure import Tenure
from shared.domain import object_refs
from shared.domain.bundle import with_bytes
from shared.domain.errors import StaleState
from shared.domain.messages import LogRecord, RunStage, Severity
from shared.domain.outcomes import (
    Outcome,
    command_outcome,
    error_log_outcome,
    hook_failed,
    limit_outcome,
    lost_outcome,
    results_refused,
)
from shared.domain.policy import Policy
from shared.domain.states import ACTIONS, FailureClass, Stage, TaskState
from shared.domain.status_report import StatusReport
from shared.host import bundle
from shared.host.capacity import HostCapacity
from shared.messaging import relay_nudges
from shared.messaging.amqp import Broker
from shared.messaging.redis_keys import RedisKeys
from shared.objects import ObjectStore
from shared.store import jobs_repo, tasks_repo
from shared.store.db import Pool
from shared.store.transition_writer import NUDGE_EVERY_S, TransitionWriter
from shared.task_types import TaskContext, TaskType
from shared.task_types.base import HOOK_FOR_ACTION

logger = logging.getLogger(__name__)
S = TaskState


class Releasable(Protocol):
    """Something held for the task that it gives back early (`consumer.Permit`)."""

    def release(self) -> None: ...


def _dump(status: StatusReport | None) -> dict[str, Any] | None:
    return status.model_dump(mode="json") if status else None


def _failing_severities(held: Tenure, failing: LogRecord | None) -> list[Severity] | None:
    """The severities whose records are kept with the job when the task failed on its log."""
    if failing is None:
        return None
    return list(Policy.model_validate(held.job.policy).fail_on_log)


def _outcome(ran: Ran, job: jobs_repo.Job) -> Outcome:
    """What a command's exit means for its task."""
    shell = ran.shell
    outcome = command_outcome(
        ran.returncode,
        ran.status,
        shell.syntax_error,
        refusal=shell.refusal,
        not_executable=[f["path"] for f in job.files or () if not f["executable"]],
    )
    if ran.failing is not None:  # the supervisor may have been slower than the exit
        outcome = error_log_outcome(ran.failing.severity.value, ran.failing.line, ran.returncode)
    if ran.over_memory is not None:  # the cause, whatever it logged
        tolerated = Policy.model_validate(job.policy).limits.tolerate_oom_kills
        if ran.returncode != 0 or not tolerated:
            outcome = limit_outcome(ran.returncode, ran.over_memory.memory_bytes, shell.killed)
    return outcome


def _never_outcome(host_id: str, why: str) -> Outcome:
    """A task whose command can never start on its host (`Ledger.why_never`): the host's
    failure (class `host`), which triage may retry elsewhere."""
    brief = f"cannot run on host {host_id}: {why}"
    return Outcome(S.FAILED_ON_CLUSTER, FailureClass.HOST, brief=brief)


T = TypeVar("T")

#: The signals a host's shutdown sends every process (`StageRunner._judged`).
_SHUTDOWN: Final = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGHUP, signal.SIGINT})
#: How long a command's death by one of them waits for the worker's own stop to be seen.
_STOP_SEEN_WITHIN_S: Final = 0.5

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
    #: How the host's commands are started (the worker's is chosen at its start,
    #: `launch.choose`; by default here, unconfined, without cgroups).
    launcher: Launcher = field(default_factory=lambda: LocalUnconfined(None))
    #: The host's capacity (None: the settings', `WorkerSettings.capacity`).
    capacity: HostCapacity | None = None
    #: Set when the worker is told to stop (`main`): see `_judged`.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    #: Where the tasks' outputs are put and their objects read (None: the store of
    #: `VIGIL_STORE_URL`, as this host reaches it: `host_store.py`).
    store: ObjectStore | None = None

    def __post_init__(self) -> None:
        #: The worker's moves of all its tasks, committed together when they overlap.
        channel = self.keys.relay_nudges()
        self.writer = TransitionWriter(
            self.pool,
            nudge_every_s=NUDGE_EVERY_S,
            nudger=lambda: relay_nudges.nudge(self.redis, channel),
        )
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
        #: The object store, as each task this host holds may use it (`host_store.py`).
        self.stores = (
            HostStore(self.settings.store_url, self.settings.host_id, store=self.store)
            if self.store is not None
            else HostStore.of_host(self.settings.store_url, self.settings.host_id, self.broker)
        )
        #: Where the outputs go before their task may complete (`stage_out.py`).
        self.stage_out = StageOut(
            self.settings.store_url,
            self.settings.store_patience_s,
            self.settings.store_quota_bytes,
        )
        #: The commands' runs, from their request taken to their exit.
        self.runs = Runs(
            self.settings, self.pool, self.broker, self.redis, self.keys, self.ledger, self.launcher
        )
        #: Where the objects tasks name come in from (`stage_in.py`).
        self.stager = StageIn.of_host(self.settings, isinstance(self.launcher, LocalConfined))

    async def _judged(self, outcome: Outcome, returncode: int) -> Outcome:
        """A command killed by a shutdown's signal while this worker is being stopped is the
        host's loss (`lost`: resubmitted, charged to infra), not the program's: a host's
        shutdown (systemd's stop), a batch system's cancel or walltime (a pilot's end) signal
        every process, the commands with the worker. The worker's own stop may be seen a
        moment after the command's exit: it is waited for, briefly, for those signals only."""
        if outcome.failure_class is not FailureClass.SIGNAL or -returncode not in _SHUTDOWN:
            return outcome
        if not self.stopping.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), _STOP_SEEN_WITHIN_S)
        if not self.stopping.is_set():
            return outcome
        return lost_outcome(
            S.ON_CPU,
            f"{outcome.brief} while its host was being stopped (a shutdown, or the batch"
            " system's cancel or walltime): the host's loss, not the program's",
        )

    async def take(self, message: RunStage, ack: Ack | None = None) -> Tenure | None:
        """Make the message's claim this worker's (`Tenure.taking`); None when the message
        is stale (a no-op; `ack`ed).

        A setup whose hooks run on the loop, with its request free, is not written here: its
        take rides on the `on_cpu` move (`Tenure.on_cpu`), one commit for `new -> setting_up ->
        queued -> on_cpu`; any other path writes it first (`Tenure.durable`). A new task
        whose request this host can never hold is not taken: its claim goes back
        (`_never_here`)."""
        return await Tenure.taking(
            self.taker, message, ack, fold=self._foldable, refuse=self._never_here
        )

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
            and not object_refs.names_objects(task.input)  # staged in from the store
        )

    def _never_here(self, task: tasks_repo.Task, job: jobs_repo.Job) -> str | None:
        """Why `task`'s command can never start on this host (None: it can, in its turn)."""
        return self.ledger.why_never(job.request, task.gpu_ids or ())

    def _fits(self, task: tasks_repo.Task, job: jobs_repo.Job) -> bool:
        """Whether `task`'s command would start at once (`Ledger.fits`)."""
        return self.ledger.fits(job.request, task.gpu_ids or (), task.staged)

    async def background_done(self) -> None:
        """Wait for the runner's background work (the hand-overs to the supervisor)."""
        await self.runs.background_done()

    async def drive(self, held: Tenure, intake: Releasable | None = None) -> None:
        """Run the task from where it was taken as far as it can go. Never raises StaleState.

        `intake` is released as soon as the command exited (the rest needs no place)."""
        if held.job.type not in self.task_types:
            missing = LookupError(
                f"task type {held.job.type!r} is not installed on {self.instance}"
            )
            await held.fail(missing, f"installed task types: {sorted(self.task_types)}")
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
            if not held.promised:  # else it is still `new`: its unacked message goes back
                await asyncio.shield(held.abandon("the worker stopped while running it"))
            raise
        except Exception as exc:  # never leave a task held by a worker that gave up on it
            logger.exception("task %s: the worker failed while driving it", held.task.id)
            try:
                await held.durable()
            except StaleState:
                return
            await held.fail(exc, traceback.format_exc())

    # -- recovery and restart hooks ----------------------------------------------------------

    async def _hook(self, held: Tenure) -> bool:
        """Run the hook of the task's action; True when the task goes on in this worker."""
        action = _HOOK_OF_RUNNING[held.state]
        _, ok_state, failed_state = ACTIONS[action]
        hook = HOOK_FOR_ACTION[action]
        attempt = await held.start_attempt(hook)
        ctx = self._context(held, attempt)
        _, failure = await self._run_hook(
            hook, failed_state, lambda: getattr(self._type(held), hook)(ctx)
        )
        if failure is not None:
            await held.end_hook(attempt, failure.state, failure, {})
            return False
        changes: dict[str, Any] = dict(tasks_repo.CLEAR_FAILURE)
        if action in _RESTARTS:
            changes["run_number"] = held.task.run_number + 1
        await held.end_hook(attempt, ok_state, None, changes)
        if ok_state is S.NEW:  # setup is dispatched again, to any worker of the pool
            await held.release(S.NEW)
            return False
        return True

    # -- setup -------------------------------------------------------------------------------

    async def _setup(self, held: Tenure) -> bool:
        attempt = held.opened_for_stage() or await held.start_attempt(Stage.SETUP.value)
        ctx = self._context(held, attempt)
        contents = await bundle_contents(self.pool, Path(self.settings.work_root), held.job)
        group = await self.launcher.files_group(held.job.owner_id) if held.job.files else 0
        failure = await self.stager.stage(
            self.stores.for_task(held), ctx.workdir, held.job.files, held.input, held.upstream
        )
        if failure is None:
            _, failure = await self._run_hook(
                "setup", S.FAILED_TO_SETUP, lambda: self._set_up(held, ctx, contents, group), held
            )
        if failure is not None:
            await held.finish(S.SETTING_UP, attempt, failure)
            return False
        held.setup_done(attempt)
        if not self._fits(held.task, held.job):  # not free: the task waits `queued` for it
            await held.queue()
        return True

    def _set_up(
        self, held: Tenure, ctx: TaskContext, contents: dict[str, bytes] | None, group: int
    ) -> bool:
        """The job's files in the work dir (readable by `group`, its commands' gid), then its
        type's setup."""
        if files := with_bytes(held.job.files):  # (those given by URL are staged in)
            work_root = Path(self.settings.work_root)
            bundle.place(work_root, held.job.id, files, contents, ctx.workdir, group)
        return self._type(held).setup(ctx)

    # -- cluster -----------------------------------------------------------------------------

    async def _cluster(self, held: Tenure, intake: Releasable | None) -> bool:
        """Run the command with its request held (from its spawn to its exit: `runs.py`); True
        when the task went on to data_ready (or post-processing)."""
        ran = None
        never = self._never_here(held.task, held.job)
        if never is not None:  # taken before this worker was (restarted) smaller
            await held.fail_unstarted(_never_outcome(self.settings.host_id, never))
        else:
            attempt = held.next_attempt()  # opened with on_cpu
            ctx = self._context(held, attempt)
            script = await self._cluster_script(held, ctx)
            if script is not None:
                ran = await self.runs.run(held, ctx, script, attempt)
        if intake is not None:
            intake.release()
        if ran is None:
            return False
        went_on = await self._report(held, ran)
        ran.reported()  # (not on a raise: its exit is then noted for the supervisor)
        return went_on

    async def _report(self, held: Tenure, ran: Ran) -> bool:
        """Move the task out of `on_cpu` by how its command ran; True when it went on to
        data_ready (or post-processing)."""
        attempt, status = ran.attempt, ran.status
        outcome = _outcome(ran, held.job)
        if outcome.failure_class is FailureClass.SIGNAL:  # rare: no await on the common path
            outcome = await self._judged(outcome, ran.returncode)
        if outcome.state is S.DATA_READY:
            close = tasks_repo.CloseAttempt(attempt, _dump(status), outcome.exit_code)
            if self._results_are_saved(held, attempt, ran.returncode, status):
                moved = await held.advance(  # post-processing has nothing to do
                    tasks_repo.Steps(
                        (S.ON_CPU, S.DATA_READY, S.POST_PROCESSING, S.COMPLETED),
                        changes=outcome.changes() | {"claim": None, "worker": None},
                        close=close,
                        # ended with the move, with the status file closing the last
                        open_=held.opening(Stage.POST_PROCESSING, done=True, status=close.status),
                        unless_waits="post_processing",
                    )
                )
                if moved is not None:
                    return False
            moved = await held.advance(
                tasks_repo.Steps(
                    (S.ON_CPU, S.DATA_READY, S.POST_PROCESSING),
                    changes=outcome.changes(),
                    close=close,
                    open_=held.opening(Stage.POST_PROCESSING),
                    unless_waits="post_processing",
                )
            )
            if moved is not None:
                return True
        await held.finish(
            S.ON_CPU,
            attempt,
            outcome,
            keep_claim=True,
            status=status,
            errors_of=_failing_severities(held, ran.failing),
            since=ran.exited_at if outcome.failure_class is not None else None,
        )
        return outcome.state is S.DATA_READY

    async def _cluster_script(self, held: Tenure, ctx: TaskContext) -> str | None:
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
        await held.fail_unstarted(
            failure or hook_failed(S.FAILED_ON_CLUSTER, "cluster_commands", None, None)
        )
        return None

    # -- post-processing ---------------------------------------------------------------------

    def _results_are_saved(
        self, held: Tenure, attempt: int, returncode: int, status: StatusReport | None
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

    async def _post_process(self, held: Tenure) -> None:
        """Post-process now, or let go of the task if it waits for prerequisites first."""
        opened = held.opened_for_stage() if held.state is S.POST_PROCESSING else None
        if opened is not None:  # moved there with the cluster's end
            attempt = opened
        else:
            entered = await held.post_processing()
            if entered is None:  # it waits for prerequisites: let go
                return
            attempt = entered
        ctx = self._context(held, attempt)
        ctx.exit_code = 0
        ctx.status = await read_status(ctx)
        _, failure = await self._run_hook(
            "save_results", S.FAILED_TO_POST_PROCESS, lambda: self._type(held).save_results(ctx)
        )
        if failure is not None and failure.detail is None:  # returned False: an app failure
            failure = results_refused(ctx.why_failed, ctx.status)
            logger.info("task %s failed its results: %s", held.task.id, failure.brief)
        outputs = list(ctx.recorded.values()) if failure is None else []
        if outputs:  # into the object store first: completed only with every one there
            await self.stage_out.complete(
                self.stores.for_task(held), held, attempt, ctx.workdir, outputs, ctx.status
            )
            return
        outcome = failure or Outcome(S.COMPLETED)
        if failure is None:
            moved = await held.advance(
                tasks_repo.Steps(
                    (S.POST_PROCESSING, S.COMPLETED),
                    changes=outcome.changes() | {"claim": None, "worker": None},
                    close=tasks_repo.CloseAttempt(attempt, _dump(ctx.status)),
                )
            )
            if moved is not None:
                return
        await held.finish(S.POST_PROCESSING, attempt, outcome, status=ctx.status)

    # -- shared steps ------------------------------------------------------------------------

    def _type(self, held: Tenure) -> TaskType:
        return self.task_types[held.job.type]

    def _context(self, held: Tenure, attempt: int) -> TaskContext:
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

    async def _run_hook(
        self, hook: str, failed: TaskState, call: Callable[[], T], held: Tenure | None = None
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
