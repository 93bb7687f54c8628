"""The default analyser: design §5's table of classes, budgets and policies."""

import pytest

from shared.domain.analyser import DefaultAnalyser, Facts, Verdict, backoff_delay
from shared.domain.policy import Backoff, Policy
from shared.domain.states import FailureClass, TaskState
from shared.domain.status_report import StatusReport

S, C = TaskState, FailureClass
RECOVERABLE = StatusReport(status="recoverable", resume={"step": 2})
FATAL = StatusReport(status="fatal", message="disk full")


def decide(**kw: object) -> Verdict:
    return DefaultAnalyser(rand=lambda: 0.5).decide(_facts(**kw)).verdict


def _facts(**kw: object) -> Facts:
    base: dict[str, object] = {
        "state": S.FAILED_ON_CLUSTER,
        "failure_class": C.EXIT,
        "policy": Policy(),
        "infra_retries": 0,
        "app_retries": 0,
    }
    return Facts(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [C.SIGNAL, C.LOST, C.HUNG])
def test_when_an_infra_failure_hits_a_restartable_task__it_is_resubmitted_within_budget(
    cls: FailureClass,
) -> None:
    policy = Policy(restartable=True, max_infra_retries=2)
    assert decide(failure_class=cls, policy=policy, infra_retries=1) is Verdict.RESUBMITTED
    assert decide(failure_class=cls, policy=policy, infra_retries=2) is Verdict.ABANDONED


@pytest.mark.parametrize("cls", [C.SIGNAL, C.LOST, C.HUNG])
def test_when_a_task_is_not_restartable__an_infra_failure_is_never_resubmitted(
    cls: FailureClass,
) -> None:
    decision = DefaultAnalyser().decide(_facts(failure_class=cls))
    assert decision.verdict is Verdict.ABANDONED
    assert "not restartable" in decision.reason


@pytest.mark.parametrize("cls", [C.EXIT, C.WALLTIME, C.ERROR_LOG, C.HOOK, C.CANCELLED])
def test_when_an_app_failure_hits_a_restartable_task__it_is_not_resubmitted(
    cls: FailureClass,
) -> None:
    assert decide(failure_class=cls, policy=Policy(restartable=True)) is Verdict.ABANDONED


def test_when_the_infra_budget_is_spent__the_app_budget_is_not_used_for_it() -> None:
    policy = Policy(restartable=True, max_infra_retries=1, max_app_retries=5)
    assert decide(failure_class=C.LOST, policy=policy, infra_retries=1) is Verdict.ABANDONED


def test_when_the_status_file_says_recoverable__it_is_recovered_within_the_app_budget() -> None:
    policy = Policy(max_app_retries=2)
    decision = DefaultAnalyser().decide(_facts(policy=policy, status=RECOVERABLE, app_retries=1))
    assert (decision.verdict, decision.resume) == (Verdict.RECOVERED, {"step": 2})
    assert decide(policy=policy, status=RECOVERABLE, app_retries=2) is Verdict.ABANDONED


def test_when_the_status_file_says_fatal__a_listed_exit_code_is_not_retried() -> None:
    policy = Policy(max_app_retries=5, retry_exit_codes=[3])
    assert decide(policy=policy, exit_code=3, status=FATAL) is Verdict.ABANDONED


@pytest.mark.parametrize(("code", "verdict"), [(3, Verdict.RECOVERED), (4, Verdict.ABANDONED)])
def test_when_the_exit_code_is_listed__it_is_recovered(code: int, verdict: Verdict) -> None:
    assert decide(policy=Policy(max_app_retries=1, retry_exit_codes=[3]), exit_code=code) is verdict


def test_when_the_signal_is_listed__it_is_recovered_in_place_of_a_resubmission() -> None:
    policy = Policy(max_app_retries=1, retry_signals=[11])
    assert decide(failure_class=C.SIGNAL, signal=11, policy=policy) is Verdict.RECOVERED
    assert decide(failure_class=C.SIGNAL, signal=9, policy=policy) is Verdict.ABANDONED


def test_when_a_setup_hook_failed__nothing_is_recovered_in_place() -> None:
    policy = Policy(max_app_retries=3, retry_exit_codes=[1])
    assert decide(state=S.FAILED_TO_SETUP, failure_class=C.HOOK, policy=policy) is (
        Verdict.ABANDONED
    )


def test_with_fail_fast__a_final_failure_fails_the_job_but_a_retry_or_a_cancel_does_not() -> None:
    analyser = DefaultAnalyser()
    policy = Policy(fail_fast=True, restartable=True)
    assert analyser.decide(_facts(policy=policy)).fail_job
    assert not analyser.decide(_facts(policy=policy, failure_class=C.LOST)).fail_job
    assert not analyser.decide(_facts(policy=policy, failure_class=C.CANCELLED)).fail_job


def test_a_prerequisite_failure_is_final() -> None:
    assert decide(state=S.FAILED_SETUP_PREREQUISITES, failure_class=None) is Verdict.ABANDONED


@pytest.mark.parametrize(
    ("retry", "rand", "expected"),
    [(0, 0.0, 0.5), (0, 1.0, 1.0), (3, 0.5, 6.0), (10, 1.0, 300.0), (10, 0.0, 150.0)],
)
def test_backoff_is_exponential_capped_with_equal_jitter(
    retry: int, rand: float, expected: float
) -> None:
    assert backoff_delay(Backoff(), retry, lambda: rand) == pytest.approx(expected)


def test_a_resubmission_carries_its_backoff_and_reason() -> None:
    policy = Policy(restartable=True, backoff=Backoff(initial_s=2, factor=3, max_s=100))
    decision = DefaultAnalyser(rand=lambda: 1.0).decide(
        _facts(failure_class=C.LOST, policy=policy, infra_retries=1)
    )
    assert decision.delay_s == pytest.approx(6.0)
    assert "lost: resubmitted (2/3)" in decision.reason
