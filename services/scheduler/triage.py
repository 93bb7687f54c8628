"""Deciding about failed tasks: recover in place, resubmit a clone, or give up (design §5).

Every transition into a failed state marks the task undecided (`tasks_repo.transition`). The
triage takes each undecided task, asks the analyser, applies the decision in one transaction
with the task row locked, writes it on the task's last attempt and publishes it as
`task.<verdict>.<job id>`. A job is not finalised while one of its tasks is undecided.

Fencing: a task `lost` while its process may still run (its host was silent, nobody killed
it) is not resubmitted until that process is known gone: the triage asks the host's
supervisor to kill it (`KillTask`, which marks the attempt reaped) and waits, unless the host
stays unreachable for `fence_timeout_s` or is a pilot whose allocation has ended.
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from services.scheduler import breaker
from services.scheduler.breaker import BreakerSettings
from shared.domain import analysers
from shared.domain.analyser import BLAMES_HOST, Analyser, Decision, Facts, PastAttempt, Verdict
from shared.domain.messages import JobEvent, JobOutcome, KillTask, TaskDecision
from shared.domain.policy import Policy
from shared.domain.states import FAILED, FailureClass, JobState, TaskState
from shared.domain.status_report import StatusReport
from shared.messaging.topology import supervise_key
from shared.operations import lineage, stop_guard
from shared.operations.revocation import revoke_job
from shared.store import attempts_repo, jobs_repo, outbox, pilots_repo, tasks_repo
from shared.store.db import Connection, Pool

logger = logging.getLogger(__name__)
S = TaskState

_UNDECIDED = """
SELECT t.id FROM tasks t WHERE NOT t.decided AND t.state = ANY($2::task_state[])
ORDER BY t.updated_at LIMIT $1
"""

#: Whether a host can no longer kill a lost task's process: silent for $2 seconds, or a pilot
#: whose allocation the batch system reports ended (its processes ended with it: Slurm kills
#: every process of a job it ends), which no kill could reach and none needs to.
_HOST_UNREACHABLE = f"""
SELECT coalesce(greatest(h.heartbeat_at, h.supervisor_heartbeat_at), h.heartbeat_at)
       < now() - make_interval(secs => $2) OR {pilots_repo.allocation_ended("h.id")}
FROM hosts h WHERE h.id = $1
"""


@dataclass(frozen=True)
class TriageSettings:
    batch: int
    fence_timeout_s: float
    quarantine_after: int  # failures blamed on one host within the window; 0 never quarantines
    quarantine_window_s: float
    quarantine_s: float  # the longest cool-down of a host's breaker
    quarantine_probe_s: float = 30.0  # the first cool-down

    @property
    def breaker(self) -> BreakerSettings:
        return BreakerSettings(
            trip_after=self.quarantine_after,
            window_s=self.quarantine_window_s,
            first_cooldown_s=self.quarantine_probe_s,
            max_cooldown_s=self.quarantine_s,
        )


class Triage:
    """Applies the analyser's decisions to undecided failed tasks."""

    def __init__(
        self, pool: Pool, analysers: Mapping[str, Analyser], settings: TriageSettings
    ) -> None:
        self._pool, self._analysers, self._settings = pool, analysers, settings
        #: Told the backoff of each task resubmitted (in seconds): it becomes releasable then.
        self.on_backoff: Callable[[float], None] = lambda _seconds: None
        #: Failed tasks the last pass found and left undecided (fenced, locked, or beyond
        #: the batch): the next round must look again.
        self.left = 0

    async def run_once(self) -> int:
        """Decide about one batch of failed tasks; returns how many were decided."""
        decided = 0
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(_UNDECIDED, self._settings.batch, _FAILED_VALUES)
            for row in rows:
                decided += await self._triage(conn, row["id"])
        self.left = len(rows) - decided + (len(rows) == self._settings.batch)
        return decided

    async def _triage(self, conn: Connection, task_id: str) -> bool:
        async with conn.transaction():
            await stop_guard.share(conn)  # first: fail_fast may cancel (see stop_guard)
            record = await tasks_repo.lock_undecided(conn, task_id, _FAILED_VALUES)
            if record is None:  # decided meanwhile, or locked by an operator's action
                return False
            task = tasks_repo.Task.from_record(record)
            policy = Policy.model_validate(record["job_policy"])
            attempts = await attempts_repo.list_for_task(conn, task.id)
            last = attempts[-1] if attempts else None
            if not await self._fenced(conn, task, last):
                return False
            if task.test and record["job_state"] != JobState.CONFIGURING.value:
                # activated meanwhile: a test run's failure changes nothing any more
                decision = Decision(Verdict.ABANDONED, "a test run of a job activated since")
            else:
                decision = self._decide(_facts(task, policy, attempts))
            await self._apply(conn, task, decision)
            await attempts_repo.record_decision(
                conn, task.id, decision.verdict.value, decision.reason
            )
            await outbox.add_task_decision(
                conn,
                TaskDecision(
                    job_id=task.job_id,
                    task_id=task.id,
                    verdict=decision.verdict.value,
                    reason=decision.reason,
                    failure_class=task.failure_class,
                ),
            )
            if task.failure_class in BLAMES_HOST and last is not None and last.host:
                await breaker.trip(conn, last.host, self._settings.breaker)
            if task.failure_class is not FailureClass.CANCELLED and not task.test:
                await _maybe_probe(conn, task.job_id, policy)
        logger.info(
            "task %s %s: %s",
            task.id,
            decision.verdict.value,
            decision.reason,
            extra={"job_id": task.job_id, "task_id": task.id},
        )
        return True

    def _decide(self, facts: Facts) -> Decision:
        """The job's analyser decides; one that is not installed here falls back to default."""
        name = facts.policy.analyser
        analyser = self._analysers.get(name)
        if analyser is not None:
            return analyser.decide(facts)
        decision = self._analysers[analysers.DEFAULT].decide(facts)
        why = f"analyser {name!r} is not installed on the scheduler, default used: "
        return replace(decision, reason=why + decision.reason)

    async def _fenced(
        self, conn: Connection, task: tasks_repo.Task, last: attempts_repo.Attempt | None
    ) -> bool:
        """Whether the task's last process is known gone, or its host unreachable for long.

        Only `lost` tasks can have a process of unknown fate; the first time, the host's
        supervisor is asked to kill it.
        """
        if task.failure_class is not FailureClass.LOST or last is None:
            return True
        if last.pid is None or last.reaped_at is not None or last.host is None:
            return True
        unreachable = await conn.fetchval(
            _HOST_UNREACHABLE, last.host, self._settings.fence_timeout_s
        )
        if unreachable is None or unreachable:
            return True
        if last.decision != "fencing":
            kill = KillTask(
                job_id=task.job_id,
                task_id=task.id,
                pid=last.pid,
                create_time=task.pid_create_time or 0.0,
                reason="lost: killed before the task is resubmitted",
                claim=last.claim,
            )
            await outbox.add_work(conn, supervise_key(last.host), kill)
            await attempts_repo.record_decision(
                conn, task.id, "fencing", f"waiting for {last.host} to kill pid {last.pid}"
            )
        return False

    async def _apply(self, conn: Connection, task: tasks_repo.Task, decision: Decision) -> None:
        if decision.verdict is Verdict.RECOVERED:
            await tasks_repo.transition(
                conn,
                task.id,
                S.RECOVER_CLUSTER,
                among=frozenset({S.FAILED_ON_CLUSTER}),
                claim=tasks_repo.UNCLAIMED,
                changes={"app_retries": task.app_retries + 1, "resume": decision.resume},
            )
            return
        await tasks_repo.mark_decided(conn, task.id)
        if decision.verdict is Verdict.RESUBMITTED:
            clone = await lineage.resubmit(conn, task.id)
            await tasks_repo.hold_back(conn, clone.id, decision.delay_s)
            self.on_backoff(decision.delay_s)
        elif decision.fail_job and not task.test:  # a test run never fails its job
            brief = f"fail_fast: task {task.id} failed ({task.failure_class}): {task.error_brief}"
            await outbox.add_job_event(
                conn,
                JobEvent(
                    job_id=task.job_id, outcome=JobOutcome.FAILED, task_id=task.id, brief=brief
                ),
            )
            await revoke_job(conn, task.job_id, brief)


_FAILED_VALUES = sorted(s.value for s in FAILED)


def _facts(task: tasks_repo.Task, policy: Policy, attempts: list[attempts_repo.Attempt]) -> Facts:
    last = attempts[-1] if attempts else None
    status = StatusReport.model_validate(last.status) if last and last.status else None
    history = tuple(
        PastAttempt(
            stage=a.stage,
            outcome=a.outcome,
            failure_class=a.failure_class,
            exit_code=a.exit_code,
            signal=a.signal,
            host=a.host,
            decision=a.decision,
        )
        for a in attempts
    )
    return Facts(
        state=task.state,
        failure_class=task.failure_class,
        policy=policy,
        infra_retries=task.infra_retries,
        app_retries=task.app_retries,
        exit_code=task.exit_code,
        signal=task.signal,
        status=status,
        host=last.host if last else task.host,
        attempts=len(attempts),
        history=history,
        task_id=task.id,
        job_id=task.job_id,
        input=task.input,
    )


async def _maybe_probe(conn: Connection, job_id: str, policy: Policy) -> None:
    """Drop the job to probing when too many of its last finished tasks failed."""
    if policy.probe_failure_rate is None:
        return
    window: Any = await conn.fetchrow(
        "SELECT count(*) AS n, count(*) FILTER (WHERE state <> 'completed') AS failed FROM ("
        " SELECT state FROM tasks WHERE job_id = $1 AND NOT test"
        "  AND (state = 'completed' OR state = ANY($3::task_state[]))"
        "  AND failure_class IS DISTINCT FROM 'cancelled'"
        " ORDER BY updated_at DESC LIMIT $2) w",
        job_id,
        policy.probe_window,
        _FAILED_VALUES,
    )
    n, failed = window["n"], window["failed"]
    if n * 2 < policy.probe_window or failed < policy.probe_failure_rate * n:
        return
    if await jobs_repo.start_probing(conn, job_id):
        logger.warning(
            "job %s probing: %d of its last %d tasks failed",
            job_id,
            failed,
            n,
            extra={"job_id": job_id},
        )


async def end_probing(pool: Pool) -> int:
    """Jobs whose probe succeeded (a task completed since probing began) release fully again."""
    async with pool.acquire() as conn:
        return await jobs_repo.end_probing(conn)
