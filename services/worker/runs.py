"""A run of a task's command on this host, from its request taken to its exit (the cluster
stage's command: `stages.py` decides what its exit means).

The command is made ready by the worker's launcher (`launch.py`: its cgroup, who it runs as),
takes its request of the host's capacity (`ledger.py`), then starts held at its gate while its
task is made durably `on_cpu` under its claim (`Tenure.on_cpu`); only then does the gate open.
Its output is shipped (`log_shipper.py`), and the supervisor is handed the command if it runs
longer than `follow_after_s`. Its exit is noted in Redis for the supervisor (`ExitNoting`): at
once for a command handed over, and for the others only if their report has not committed
`NOTE_AFTER_S` after the exit. Its request is given back as soon as its main process has ended.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from redis.asyncio import Redis

from services.worker import limits
from services.worker.launch import Command, Launch, Launcher, RunningCommand
from services.worker.ledger import Hold, Ledger
from services.worker.log_shipper import LogShipper
from services.worker.settings import WorkerSettings
from services.worker.tenure import Tenure
from shared.domain.errors import UNAVAILABLE
from shared.domain.log_lines import ShellNotes
from shared.domain.messages import LogRecord, WatchProcess
from shared.domain.policy import Policy
from shared.domain.states import TaskState
from shared.domain.status_report import StatusReport
from shared.host import handovers, job_files, marks
from shared.host.cgroups import TaskLimits
from shared.host.status_file import read_status as read_status_file
from shared.host.status_file import surely_absent
from shared.messaging.amqp import Broker
from shared.messaging.redis_keys import JOB_TTL_S, RedisKeys
from shared.store.db import Pool
from shared.task_types import TaskContext

logger = logging.getLogger(__name__)
S = TaskState

#: How long reading a status file may take (off the event loop) before the task fails on it.
STATUS_READ_TIMEOUT_S: Final = 10.0

#: How long after its exit the exit of a command not handed over is noted, if its report (the
#: move out of `on_cpu`) has not committed by then. The supervisor's reconcile may find such a
#: task `on_cpu` with its process gone; it waits `report_grace_s` (0.5 s) for a note or the
#: report before it judges the process vanished (`services/supervisor/watchers.py`). A short
#: command's report commits within milliseconds, so its note (a Redis round trip, the last of
#: the task's path) is mostly never written.
NOTE_AFTER_S: Final = 0.05


async def read_status(ctx: TaskContext) -> StatusReport | None:
    """The run's status file, read in a thread: a job's file never blocks the event loop
    (`shared.host.status_file.read_status` refuses FIFOs, devices and links without waiting)."""
    if surely_absent(ctx.workdir, ctx.status_file):  # most commands write none: no thread hop
        return None
    try:
        async with asyncio.timeout(STATUS_READ_TIMEOUT_S):
            return await asyncio.to_thread(read_status_file, ctx.workdir, ctx.status_file)
    except TimeoutError:
        message = f"the status file could not be read within {STATUS_READ_TIMEOUT_S:g} s"
        return StatusReport(status="fatal", message=message)


class ExitNoting:
    """The note of one command's exit for the supervisor: written at the exit if the command
    was handed over (the supervisor watches it exit), else put off `NOTE_AFTER_S` and not
    written if the exit is reported first."""

    def __init__(
        self,
        write: Callable[[int], Coroutine[Any, Any, None]],
        background: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._write, self._background = write, background
        self._later: asyncio.TimerHandle | None = None
        self._returncode = 0
        #: Whether the command has been handed over to the supervisor.
        self.handed = False

    @property
    def pending(self) -> bool:
        """Whether a note put off is still due (neither written yet nor given up)."""
        return self._later is not None

    async def exited(self, returncode: int) -> None:
        """The command exited with `returncode`: note it now, or put the note off."""
        if self.handed:
            await self._write(returncode)
        else:
            self._returncode = returncode
            self._later = asyncio.get_running_loop().call_later(NOTE_AFTER_S, self.flush)

    def flush(self) -> None:
        """Write a note put off, now (in the background)."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
            self._background(self._write(self._returncode))

    def reported(self) -> None:
        """The exit is reported: a note put off is not written."""
        if self._later is not None:
            self._later.cancel()
            self._later = None


@dataclass(frozen=True)
class Ran:
    """A command that ran to its exit."""

    attempt: int
    returncode: int  # negative: killed by that signal
    failing: LogRecord | None  # its first line with a severity in `fail_on_log`
    exited_at: float | None
    status: StatusReport | None
    #: Its memory limit, if the kernel killed one of its processes for going over it.
    over_memory: TaskLimits | None = None
    #: What bash said on stderr of how the script went (`ShellNotes`).
    shell: ShellNotes = field(default_factory=ShellNotes)
    #: Its exit's note: `reported()` once the exit is reported (the move out of `on_cpu` has
    #: committed, or found the task not this worker's any more).
    note: ExitNoting | None = None

    def reported(self) -> None:
        """Its exit is reported: its note, if put off, is not needed."""
        if self.note is not None:
            self.note.reported()


class _Suspended(Exception):
    """The job was suspended between setup and the command's start."""


class Runs:
    """The runs of this worker's commands."""

    def __init__(
        self,
        settings: WorkerSettings,
        pool: Pool,
        broker: Broker,
        redis: Redis,
        keys: RedisKeys,
        ledger: Ledger,
        launcher: Launcher,
    ) -> None:
        self.settings = settings
        self.pool, self.broker, self.redis, self.keys = pool, broker, redis, keys
        #: What the host's commands hold of its capacity (`StageRunner.ledger`).
        self.ledger = ledger
        self.launcher = launcher
        #: A task's memory limit when its job gives none (MiB; 0: none).
        self._memory_mb = limits.default_memory_mb(settings.job_memory_mb)
        self._pending: set[asyncio.Task[None]] = set()

    async def run(self, held: Tenure, ctx: TaskContext, script: str, attempt: int) -> Ran | None:
        """Run `script`, the command of cluster attempt `attempt`, with its request held (from
        its spawn to its exit), to its exit; None when it did not run (the job was suspended
        meanwhile: the task is given back, `queued`)."""
        # A diagnosis is about this attempt only.
        job_files.remove_file(ctx.workdir, ctx.status_name)
        policy = Policy.model_validate(held.job.policy)
        settings = self.settings
        bounds = limits.resolve(
            policy.limits, held.job.request, self._memory_mb, settings.job_cpus, settings.job_pids
        )
        task = held.task
        hold = self.ledger.hold(held.job.request, task.gpu_ids or (), task.staged, task.id)
        launch, running = await self._start(held, ctx, script, policy, bounds, hold)
        note = ExitNoting(self._exit_noter(held), self._background)
        try:  # the gate opens once the process is in its cgroup and the task durably on_cpu
            _, on_cpu = await asyncio.gather(
                running.join_cgroup(),
                held.on_cpu(
                    attempt,
                    running.pid,
                    running.create_time,
                    # Not awaited: the supervisor's periodic reconcile finds the process
                    # anyway, and every verdict it reaches is fenced by the claim.
                    lambda: self._background(self._hand_over(held, running, note)),
                ),
            )
            if not on_cpu:
                raise _Suspended
        except BaseException as exc:  # not ours any more (or we stop): never run the script
            running.stop()
            hold.free()
            await running.reaped()
            launch.end()
            if isinstance(exc, _Suspended):  # suspended since setup: given back unstarted
                await held.release(S.QUEUED)
                return None
            raise
        running.open_gate()
        over_memory = None
        try:
            returncode, failing, shell = await self._watch_output(
                held, attempt, ctx, running, policy, hold.free, note
            )
        except BaseException:
            note.flush()  # an exit seen will not be reported by this run
            raise
        finally:
            hold.free()
            if launch.end(running):
                over_memory = bounds
        status = await read_status(ctx)
        return Ran(
            attempt,
            returncode,
            failing,
            running.exited_at,
            status,
            over_memory,
            shell,
            note,
        )

    async def _start(
        self,
        held: Tenure,
        ctx: TaskContext,
        script: str,
        policy: Policy,
        bounds: TaskLimits,
        hold: Hold,
    ) -> tuple[Launch, RunningCommand]:
        """Make the command ready (its cgroup and work dir), then take `hold` (its request)
        and start it, held at its gate until on_cpu is durable (on failure, the hold and
        what was made ready are given back)."""
        command = Command(
            held.task.id, held.claim, held.job.owner_id, ctx.workdir, policy.network, bounds
        )
        launch = await self.launcher.prepare(command)
        try:
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
            return launch, await launch.start(script, ctx.workdir, env)
        except BaseException:
            hold.free()
            launch.end()
            raise

    async def _take_request(self, held: Tenure, hold: Hold) -> None:
        """Wait for the request of the command about to be started; a task just set up that
        must wait for it waits durably `queued` (as setup makes it when it is not free
        then)."""
        fits = self.ledger.fits(held.job.request, held.task.gpu_ids or (), held.task.staged)
        if not fits and held.unqueued:
            await held.queue()
        await hold.take()

    async def _watch_output(
        self,
        held: Tenure,
        attempt: int,
        ctx: TaskContext,
        running: RunningCommand,
        policy: Policy,
        exited: Callable[[], None],
        note: ExitNoting,
    ) -> tuple[int, LogRecord | None, ShellNotes]:
        """Ship the output until the command exits: (its exit status, its first line with a
        severity in `fail_on_log` if any, what bash said of how the script went).
        `exited` is called as soon as the command's main process has ended, before its output
        is drained, and its exit is noted (`note`)."""
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

            async def on_exit(returncode: int) -> None:
                exited()
                await note.exited(returncode)

            returncode = await running.watch(shipper.add, on_exit)
        finally:
            await shipper.close()
        return returncode, shipper.failing, shipper.shell

    def _exit_noter(self, held: Tenure) -> Callable[[int], Coroutine[Any, Any, None]]:
        """Writes a command's exit note for the supervisor, handed over or not: its reconcile
        follows any task it finds `on_cpu`, and judges an exit it finds unnoted by its grace
        (a command whose many lines took longer to store than that was failed as `signal`;
        `ExitNoting` puts the note of a
        command not handed over off until its report is late)."""

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

    async def _hand_over(self, held: Tenure, running: RunningCommand, note: ExitNoting) -> None:
        """Hand the process to the supervisor once it has run `follow_after_s`: one that
        exits sooner is seen to its end by this worker, its parent (what the supervisor
        would do for it: see `services/supervisor/watchers.py`), and costs no message. The
        hand-over goes through Redis (`shared/host/handovers.py`)."""
        await asyncio.sleep(self.settings.follow_after_s)
        if running.exited_at is not None:
            return
        note.handed = True
        watch = WatchProcess(
            job_id=held.task.job_id,
            task_id=held.task.id,
            claim=held.claim,
            pid=running.pid,
            create_time=running.create_time,
            ran_s=self.settings.follow_after_s,
        )
        try:
            await handovers.hand_over(self.redis, self.keys.handovers(self.settings.host_id), watch)
        except Exception as exc:
            logger.warning("could not hand task %s to the supervisor: %s", watch.task_id, exc)

    async def background_done(self) -> None:
        """Wait for the background work (the hand-overs to the supervisor)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
