"""A watcher coroutine per running process: its exit, its vitals and its error log.

- **Exit**: notified by pidfd. The worker (the parent) reports the exit once the output is
  flushed, and notes it in Redis: at once for a process handed over, 50 ms after the exit for
  another unless its report has committed by then (`services/worker/runs.py`, `NOTE_AFTER_S`).
  A noted exit is the worker's to report. If the task is still `on_cpu` under the same claim
  `report_grace_s` later with no note, the process died of something outside Vigil: the task
  fails as `signal`.
- **Vitals**: every `vitals_s`, `walltime` (since the cluster attempt started) and
  `hang_timeout` (since the last sign of life: output written to the run files or a status
  file; paused while the job is suspended) are checked (`shared.domain.vitals`).
- **Error log**: a record of the task with a severity in the job's `fail_on_log` (through
  `ErrorLogs`) fails it as `error_log`. The job's binding is made only for a process that
  has run `follow_after_s` (then the errors already stored are read too): binding and
  unbinding cost the broker a metadata change each, which a command of a few milliseconds
  would pay for nothing, since the worker fails it on its error log when it exits. The worker
  hands a process over only once it has run that long (`WatchProcess.ran_s`); the reconcile
  finds the others that are `on_cpu` in PostgreSQL.

Each verdict is a compare-and-set on the task (`on_cpu` under the watched claim) before the
tree is killed (TERM, `kill_grace_s`, KILL), so the worker's own late report is fenced off.
"""

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from redis.asyncio import Redis

from services.supervisor.error_logs import ErrorLogs
from shared.domain.errors import UNAVAILABLE
from shared.domain.messages import LogRecord
from shared.domain.outcomes import Outcome, error_log_outcome, vanished_outcome
from shared.domain.policy import Policy
from shared.domain.states import FailureClass, TaskState
from shared.domain.vitals import Vitals, verdict
from shared.host.cgroups import Cgroups
from shared.host.processes import exit_waiter, signal_tree, terminate_tree
from shared.messaging.redis_keys import RedisKeys
from shared.operations import loss
from shared.store import job_errors_repo, jobs_repo, tasks_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)

_POLL_S = 0.05
#: Before reading the task from PostgreSQL, the worker's exit note is looked for again after
#: these pauses (Redis reads only): the note most often lands within a few milliseconds.
_NOTE_PAUSES_S = (0.002, 0.008)

_LOAD = """
SELECT t.job_id, t.state::text AS state, t.claim, t.workdir, t.run_number,
       j.policy, a.attempt, extract(epoch FROM a.started_at) AS started
FROM tasks t JOIN jobs j ON j.id = t.job_id
LEFT JOIN LATERAL (SELECT attempt, started_at FROM attempts
                   WHERE task_id = t.id AND claim = t.claim AND stage = 'cluster'
                   ORDER BY attempt DESC LIMIT 1) a ON true
WHERE t.id = $1
"""


@dataclass(frozen=True)
class WatchSettings:
    report_grace_s: float
    vitals_s: float
    kill_grace_s: float
    follow_after_s: float = 0.0


@dataclass
class Handed:
    """A process the worker handed over: its task, the claim it runs under, its identity.
    All that judging its exit needs."""

    task_id: str
    job_id: str
    claim: UUID
    pid: int
    create_time: float
    cgroup: Path | None = None
    exited_at: float | None = None  # epoch seconds, when the pidfd said it exited


@dataclass(kw_only=True)
class Watched(Handed):
    """A command still running after `follow_after_s`, and what is known about it."""

    attempt: int
    policy: Policy
    vitals: Vitals
    signs: list[Path] = field(default_factory=list)  # files whose writes are signs of life
    ending: bool = False  # a verdict is being applied


class Watchers:
    """The watched processes of this host, keyed by (task id, claim)."""

    def __init__(
        self,
        pool: Pool,
        redis: Redis,
        keys: RedisKeys,
        settings: WatchSettings,
        cgroups: Cgroups | None,
        error_logs: ErrorLogs,
    ) -> None:
        self._pool, self._redis, self._keys, self._settings = pool, redis, keys, settings
        self._cgroups, self._error_logs = cgroups, error_logs
        self._tasks: dict[tuple[str, UUID], asyncio.Task[None]] = {}
        self._watched: dict[str, Watched] = {}

    def is_watching(self, task_id: str, claim: UUID) -> bool:
        return (task_id, claim) in self._tasks

    def is_following(self, task_id: str) -> bool:
        """Whether its process is followed (loaded, vitals checked, error log bound)."""
        return task_id in self._watched

    def watch(
        self,
        task_id: str,
        job_id: str,
        claim: UUID,
        pid: int,
        create_time: float,
        *,
        ran_s: float = 0.0,
    ) -> None:
        """Start watching (idempotent: a process already watched is left alone). `ran_s`: how
        long it has run already (it is followed once it has run `follow_after_s`)."""
        key = (task_id, claim)
        if key in self._tasks:
            return
        task = asyncio.create_task(
            self._watch(task_id, job_id, claim, pid, create_time, ran_s), name=f"watch-{task_id}"
        )
        self._tasks[key] = task
        task.add_done_callback(lambda _t: self._tasks.pop(key, None))

    async def _watch(
        self, task_id: str, job_id: str, claim: UUID, pid: int, create_time: float, ran_s: float
    ) -> None:
        """A process that exits within `follow_after_s` is only judged at its exit (most often
        the worker's note says it is the worker's to report: no database read at all). One
        still running is loaded (policy, attempt), followed and watched until it exits."""
        waiter = exit_waiter(pid, create_time)
        exited = asyncio.ensure_future(waiter) if waiter is not None else None
        try:
            follow_in = self._settings.follow_after_s - ran_s
            if exited is not None and follow_in > 0:
                await asyncio.wait({exited}, timeout=follow_in)
            if exited is None or exited.done():
                cgroup = self._cgroups.path(task_id, claim) if self._cgroups else None
                await self._judge_exit(
                    Handed(task_id, job_id, claim, pid, create_time, cgroup, time.time())
                )
                return
            watched = await self._load(task_id, claim, pid, create_time)
            if watched is None:
                return
            await self._watch_running(watched, exited)
        finally:
            if exited is not None and not exited.done():
                exited.cancel()

    async def _watch_running(self, watched: Watched, exited: "asyncio.Future[Any]") -> None:
        task_id = watched.task_id
        self._watched[task_id] = watched
        logger.info("watching task %s (pid %d)", task_id, watched.pid, extra={"task_id": task_id})
        try:
            await self._error_logs.follow(watched.job_id, watched.policy.fail_on_log)
            try:
                await self._check_logged_errors(watched)
                if not await self._until_exit(watched, exited):
                    return
                watched.exited_at = time.time()
                if not watched.ending:
                    await self._judge_exit(watched)
            finally:
                await self._error_logs.unfollow(watched.job_id)
        finally:
            if self._watched.get(task_id) is watched:
                del self._watched[task_id]

    async def _load(
        self, task_id: str, claim: UUID, pid: int, create_time: float
    ) -> Watched | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(_LOAD, task_id)
        if row is None or row["state"] != TaskState.ON_CPU.value or row["claim"] != claim:
            return None
        policy = Policy.model_validate(row["policy"])
        started = float(row["started"]) if row["started"] is not None else time.time()
        signs = []
        if row["workdir"]:
            run = Path(row["workdir"]) / ".vigil"
            n = row["run_number"]
            signs = [run / f"run{n}.stdout", run / f"run{n}.stderr", run / f"status.run{n}.json"]
        cgroup = self._cgroups.path(task_id, claim) if self._cgroups else None
        return Watched(
            task_id=task_id,
            job_id=row["job_id"],
            claim=claim,
            pid=pid,
            create_time=create_time,
            attempt=row["attempt"] or 0,
            policy=policy,
            vitals=Vitals(started=started, last_sign=started),
            signs=signs,
            cgroup=cgroup,
        )

    # -- while it runs -----------------------------------------------------------------------

    async def _until_exit(self, watched: Watched, exited: "asyncio.Future[Any]") -> bool:
        """Wait for the exit, checking vitals meanwhile; False if a verdict ended the task."""
        try:
            while not watched.ending:
                done, _ = await asyncio.wait({exited}, timeout=self._settings.vitals_s)
                if done:
                    return True
                await self._check_vitals(watched)
            return False
        finally:
            if not exited.done():
                exited.cancel()

    async def _check_vitals(self, watched: Watched) -> None:
        policy = watched.policy
        if policy.hang_timeout is None and policy.walltime is None:
            return
        now = time.time()
        watched.vitals = watched.vitals.seen(_newest_mtime(watched.signs))
        if policy.hang_timeout is not None and await self._suspended(watched.job_id):
            watched.vitals = watched.vitals.seen(now)  # a suspended job is not hung
        outcome = verdict(now, watched.vitals, policy.hang_timeout, policy.walltime)
        if outcome is not None:
            await self.end(watched, outcome, since=_limit_passed(watched, outcome))

    async def _suspended(self, job_id: str) -> bool:
        try:
            async with self._pool.acquire() as conn:
                return await jobs_repo.is_suspended(conn, job_id)
        except UNAVAILABLE:
            return True  # unknown: never judge a task hung on a guess

    async def _check_logged_errors(self, watched: Watched) -> None:
        """Errors persisted before the log binding existed are read from PostgreSQL."""
        async with self._pool.acquire() as conn:
            line = await job_errors_repo.first_error(
                conn, watched.task_id, watched.attempt, watched.policy.fail_on_log
            )
        if line is not None:
            outcome = error_log_outcome("error", line, await self._noted_exit(watched))
            await self.end(watched, outcome, errors=True)

    async def on_log(self, record: LogRecord) -> None:
        """A record from the error-log binding of a watched job."""
        watched = self._watched.get(record.task_id)
        if watched is None or watched.ending or record.attempt != watched.attempt:
            return
        if record.severity in watched.policy.fail_on_log:
            # a command that logged its error and exited is failed by whoever comes first,
            # the worker at the exit or this verdict: the exit status its worker noted stays
            returncode = await self._noted_exit(watched)
            await self.end(
                watched,
                error_log_outcome(record.severity.value, record.line, returncode),
                errors=True,
                since=record.ts.timestamp(),
            )

    # -- verdicts ----------------------------------------------------------------------------

    async def end(
        self,
        watched: Watched,
        outcome: Outcome,
        *,
        errors: bool = False,
        since: float | None = None,
    ) -> bool:
        """Fail the task with `outcome` (if it still runs under the claim), then kill its tree.

        `since`: when the failure happened (epoch seconds), for the detection latency."""
        if watched.ending:
            return False
        watched.ending = True
        async with self._pool.acquire() as conn, conn.transaction():
            task = await tasks_repo.get(conn, watched.task_id)
            if task is None or task.state is not TaskState.ON_CPU or task.claim != watched.claim:
                return False
            if not await loss.declare(conn, task, outcome, reaped=True, since=since):
                return False
            if errors:
                await job_errors_repo.record_from_logs(
                    conn,
                    watched.job_id,
                    watched.task_id,
                    watched.attempt,
                    watched.policy.fail_on_log,
                )
        logger.warning(
            "task %s: %s", watched.task_id, outcome.brief, extra={"task_id": watched.task_id}
        )
        await terminate_tree(
            watched.pid, watched.create_time, watched.cgroup, self._settings.kill_grace_s
        )
        return True

    async def _judge_exit(self, watched: Handed) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.report_grace_s
        for pause in _NOTE_PAUSES_S:  # the worker's pidfd fired when ours did: its note is near
            if await self._noted(watched):  # the worker saw it exit: the report is its own
                return
            await asyncio.sleep(pause)
        while True:
            if await self._noted(watched):
                return
            async with self._pool.acquire() as conn:
                task = await tasks_repo.get(conn, watched.task_id)
                reported = (
                    task is None
                    or task.state is not TaskState.ON_CPU
                    or task.claim != watched.claim
                )
                if reported:
                    return
                if loop.time() >= deadline:
                    assert task is not None
                    if task.pid != watched.pid:
                        return
                    # what the dead leader left behind dies with it, before anything reruns
                    signal_tree(watched.pid, watched.create_time, watched.cgroup, signal.SIGKILL)
                    vanished = vanished_outcome()
                    if await loss.declare(
                        conn, task, vanished, reaped=True, since=watched.exited_at
                    ):
                        logger.warning(
                            "task %s: process %d vanished unreported", task.id, watched.pid
                        )
                    return
            await asyncio.sleep(_POLL_S)

    async def _noted(self, watched: Handed) -> bool:
        """Whether the worker noted this exit (it will report it); unknown counts as no."""
        return await self._note(watched) is not None

    async def _noted_exit(self, watched: Handed) -> int | None:
        """The exit status the worker noted for this process (negative: the signal that
        killed it), None when it noted none (or Redis cannot say)."""
        note = await self._note(watched)
        try:
            return int(note) if note is not None else None
        except ValueError:
            return None

    async def _note(self, watched: Handed) -> str | None:
        """What the worker noted of this process's exit under its claim (the exit status),
        None when it noted nothing; unknown counts as nothing."""
        try:
            note = await self._redis.hget(self._keys.job_exits(watched.job_id), watched.task_id)
        except UNAVAILABLE as exc:
            logger.warning("cannot read the exit note of task %s: %s", watched.task_id, exc)
            return None
        if not isinstance(note, str):
            return None
        claim, _, status = note.partition(" ")
        return status if claim == str(watched.claim) else None

    async def close(self) -> None:
        """Stop watching (the processes go on; a new supervisor re-attaches to them)."""
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)


def _limit_passed(watched: Watched, outcome: Outcome) -> float:
    """When the walltime or hang_timeout that `outcome` is about ran out (epoch seconds)."""
    policy, vitals = watched.policy, watched.vitals
    if outcome.failure_class is FailureClass.WALLTIME and policy.walltime is not None:
        return vitals.started + policy.walltime
    return vitals.last_sign + (policy.hang_timeout or 0.0)


def _newest_mtime(paths: list[Path]) -> float | None:
    newest = None
    for path in paths:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return newest
