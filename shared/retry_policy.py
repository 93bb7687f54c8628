"""Automatic handling of failed attempts (design §5): pure decisions, no I/O."""

from shared.outcomes import Outcome
from shared.policy import Policy
from shared.states import FailureClass
from shared.status_file import StatusReport


def recover_in_place(
    policy: Policy, outcome: Outcome, status: StatusReport | None, app_retries_used: int
) -> bool:
    """Whether an app failure of the cluster stage is recovered in place automatically.

    Only when the status file says `recoverable`, or the exit code / signal is listed in the
    policy, and the app budget (`max_app_retries`) is not spent. `fatal` is never retried.
    """
    if app_retries_used >= policy.max_app_retries:
        return False
    if status is not None and status.status == "fatal":
        return False
    if status is not None and status.status == "recoverable":
        return outcome.failure_class in (FailureClass.EXIT, FailureClass.SIGNAL)
    if outcome.failure_class is FailureClass.EXIT and outcome.exit_code is not None:
        return outcome.exit_code in policy.retry_exit_codes
    if outcome.failure_class is FailureClass.SIGNAL and outcome.signal is not None:
        return outcome.signal in policy.retry_signals
    return False
