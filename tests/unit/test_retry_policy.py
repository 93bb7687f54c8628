"""Automatic recovery in place of app failures (design §5)."""

import pytest

from shared.outcomes import Outcome, command_outcome, vanished_outcome
from shared.policy import Policy
from shared.retry_policy import recover_in_place
from shared.states import FailureClass, TaskState
from shared.status_file import StatusReport

RECOVERABLE = StatusReport(status="recoverable", resume={"step": 2})
FATAL = StatusReport(status="fatal", message="disk full")


def test_when_the_status_file_says_recoverable__it_is_recovered_within_the_budget() -> None:
    policy = Policy(max_app_retries=2)
    outcome = command_outcome(1, RECOVERABLE)
    assert recover_in_place(policy, outcome, RECOVERABLE, app_retries_used=1)
    assert not recover_in_place(policy, outcome, RECOVERABLE, app_retries_used=2)


def test_when_the_status_file_says_fatal__it_is_never_recovered_even_for_a_listed_code() -> None:
    policy = Policy(max_app_retries=5, retry_exit_codes=[3])
    assert not recover_in_place(policy, command_outcome(3, FATAL), FATAL, 0)


@pytest.mark.parametrize(("code", "listed"), [(3, True), (4, False)])
def test_when_the_exit_code_is_listed__it_is_recovered(code: int, listed: bool) -> None:
    policy = Policy(max_app_retries=1, retry_exit_codes=[3])
    assert recover_in_place(policy, command_outcome(code, None), None, 0) is listed


def test_when_the_signal_is_listed__it_is_recovered() -> None:
    policy = Policy(max_app_retries=1, retry_signals=[9])
    assert recover_in_place(policy, command_outcome(-9, None), None, 0)
    assert not recover_in_place(policy, command_outcome(-15, None), None, 0)


def test_with_the_default_policy__nothing_is_recovered_automatically() -> None:
    assert not recover_in_place(Policy(), command_outcome(1, RECOVERABLE), RECOVERABLE, 0)


def test_a_success_or_a_lost_process_is_not_an_app_failure_to_recover() -> None:
    policy = Policy(max_app_retries=3, retry_signals=[9])
    assert not recover_in_place(policy, Outcome(TaskState.DATA_READY), RECOVERABLE, 0)
    lost = Outcome(TaskState.FAILED_ON_CLUSTER, FailureClass.LOST, signal=9)
    assert not recover_in_place(policy, lost, None, 0)
    assert vanished_outcome().failure_class is FailureClass.SIGNAL
