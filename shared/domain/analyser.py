"""What happens after a failed attempt (design §5): pure decisions, no I/O.

The scheduler's triage gathers the `Facts` of a failed task and asks an analyser for a
`Decision`: recover it in place, resubmit a clone, or give up (and, with `fail_fast`, fail the
whole job). `DefaultAnalyser` is design §5; a site can wrap it to adjust its decisions.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from shared.domain.policy import Backoff, Policy
from shared.domain.states import FailureClass, TaskState
from shared.domain.status_report import StatusReport

#: Classes caused by the infrastructure rather than by the command: resubmitted if restartable.
INFRA: frozenset[FailureClass] = frozenset(
    {
        FailureClass.SIGNAL,
        FailureClass.LOST,
        FailureClass.HUNG,
        FailureClass.HOST,
        FailureClass.PLATFORM,
    }
)

#: Classes that count against the host a task failed on (design §5, blame): `lost`, its
#: worker or supervisor dying or going silent, and `host`, its disk refusing the task's files
#: (full, over quota, read-only). A signal (a program's own fault signal, or one
#: from outside such as the OOM killer or an operator's kill) and a hang are infra for
#: retrying but the job's record, never a host's: otherwise any user could take a pool out with
#: `kill -SEGV $$`.
BLAMES_HOST: frozenset[FailureClass] = frozenset({FailureClass.LOST, FailureClass.HOST})


class Verdict(StrEnum):
    """The kinds of decision; each is published as `task.<verdict>.<job id>`."""

    RECOVERED = "recovered"  # recover_cluster in place, within max_app_retries
    RESUBMITTED = "resubmitted"  # a clone starts at `new`, within max_infra_retries
    ABANDONED = "abandoned"  # the task stays failed


@dataclass(frozen=True)
class PastAttempt:
    """One earlier (or the last) attempt of the task, oldest first in `Facts.history`."""

    stage: str
    outcome: str | None
    failure_class: str | None
    exit_code: int | None
    signal: int | None
    host: str | None
    decision: str | None


@dataclass(frozen=True)
class Facts:
    """Everything known about a failed task when its failure is triaged."""

    state: TaskState
    failure_class: FailureClass | None
    policy: Policy
    infra_retries: int
    app_retries: int
    exit_code: int | None = None
    signal: int | None = None
    status: StatusReport | None = None
    host: str | None = None
    attempts: int = 0
    history: tuple[PastAttempt, ...] = ()
    task_id: str = ""
    job_id: str = ""
    input: object = None


@dataclass(frozen=True)
class Decision:
    """What to do with a failed task, and why (recorded on its last attempt)."""

    verdict: Verdict
    reason: str
    delay_s: float = 0.0  # resubmission backoff
    resume: dict[str, Any] | None = None  # $VIGIL_RESUME of an in-place recovery
    fail_job: bool = False  # fail_fast: the job fails and its pending work is revoked


class Analyser(Protocol):
    """Decides about one failed task."""

    def decide(self, facts: Facts) -> Decision: ...


def backoff_delay(backoff: Backoff, retry: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before resubmission number `retry` (0-based): exponential, capped, with jitter.

    "Equal jitter": half the capped delay, plus a random share of the other half, so that
    clones of tasks that failed together do not all come back at the same instant.
    """
    capped = min(backoff.max_s, backoff.initial_s * backoff.factor**retry)
    return capped / 2 + rand() * capped / 2


class DefaultAnalyser:
    """Design §5: infra failures of restartable tasks are resubmitted; app failures are
    recovered in place only when the status file or the policy says so; the rest fail."""

    def __init__(self, rand: Callable[[], float] = random.random) -> None:
        self._rand = rand

    def decide(self, facts: Facts) -> Decision:
        cls, policy = facts.failure_class, facts.policy
        if cls is FailureClass.CANCELLED:
            return Decision(Verdict.ABANDONED, "cancelled: no automatic handling")
        if cls in INFRA:
            infra = self._infra(facts)
            if infra is not None:
                return infra
        if _recovers_in_place(facts):
            resume = facts.status.resume if facts.status else None
            used = f"{facts.app_retries + 1}/{policy.max_app_retries}"
            return Decision(
                Verdict.RECOVERED, f"{_app_reason(facts)}: recovered ({used})", 0, resume
            )
        return Decision(Verdict.ABANDONED, _abandon_reason(facts), fail_job=policy.fail_fast)

    def _infra(self, facts: Facts) -> Decision | None:
        policy = facts.policy
        if not policy.restartable or facts.infra_retries >= policy.max_infra_retries:
            return None
        delay = backoff_delay(policy.backoff, facts.infra_retries, self._rand)
        used = f"{facts.infra_retries + 1}/{policy.max_infra_retries}"
        reason = f"{facts.failure_class}: resubmitted ({used}) after {delay:.1f}s"
        return Decision(Verdict.RESUBMITTED, reason, delay_s=delay)


def _recovers_in_place(facts: Facts) -> bool:
    """An app failure of the command, with the app budget left, that the status file or the
    policy's listed exit codes/signals make retryable; `fatal` never is."""
    policy, status = facts.policy, facts.status
    if (
        facts.state is not TaskState.FAILED_ON_CLUSTER
        or facts.app_retries >= policy.max_app_retries
    ):
        return False
    if facts.failure_class not in (FailureClass.EXIT, FailureClass.SIGNAL):
        return False
    if status is not None and status.status != "success":
        return status.status == "recoverable"
    if facts.failure_class is FailureClass.EXIT:
        return facts.exit_code is not None and facts.exit_code in policy.retry_exit_codes
    return facts.signal is not None and facts.signal in policy.retry_signals


def _app_reason(facts: Facts) -> str:
    if facts.status is not None and facts.status.status == "recoverable":
        return "status file says recoverable"
    if facts.failure_class is FailureClass.EXIT:
        return f"exit code {facts.exit_code} is in retry_exit_codes"
    return f"signal {facts.signal} is in retry_signals"


def _abandon_reason(facts: Facts) -> str:
    cls, policy = facts.failure_class, facts.policy
    if cls in INFRA and not policy.restartable:
        why = f"{cls}: not restartable, never resubmitted automatically"
    elif cls in INFRA:
        why = f"{cls}: infra budget spent ({facts.infra_retries}/{policy.max_infra_retries})"
    elif cls is None:
        why = f"{facts.state}: nothing to retry"
    elif facts.state is TaskState.FAILED_ON_CLUSTER and cls in (
        FailureClass.EXIT,
        FailureClass.SIGNAL,
    ):
        if facts.status is not None and facts.status.status == "fatal":
            why = f"{cls}: status file says fatal"
        elif facts.app_retries and facts.app_retries >= policy.max_app_retries:
            why = f"{cls}: app budget spent ({facts.app_retries}/{policy.max_app_retries})"
        else:
            why = f"{cls}: app failure, not listed for retry"
    else:
        why = f"{cls}: fails the task"
    return why + ("; fail_fast fails the job" if policy.fail_fast else "")
