"""What a command owes its job's suspension (a lost FreezeTask made good at a reconcile)."""

import signal
import uuid

import pytest

from services.supervisor.freezes import Suspensions, owed


@pytest.mark.parametrize(
    ("suspended", "state", "expected"),
    [
        (True, "S", signal.SIGSTOP),
        (True, "R", signal.SIGSTOP),
        (True, "T", None),
        (False, "T", signal.SIGCONT),
        (False, "S", None),
        (True, None, None),  # gone
        (False, None, None),
        (True, "Z", None),  # a zombie: nothing to stop
        (False, "t", None),  # stopped by a tracer: its tracer's
        (True, "t", None),
    ],
)
def test_a_command_is_stopped_or_continued_only_when_it_differs_from_its_job(
    suspended: bool, state: str | None, expected: signal.Signals | None
) -> None:
    assert owed(suspended, state) == expected


def test_a_difference_is_acted_on_only_when_two_rounds_in_a_row_saw_it() -> None:
    claim = uuid.uuid4()
    suspensions = Suspensions()

    first = suspensions.confirmed("t-1", claim, signal.SIGSTOP)
    suspensions.next_round()
    second = suspensions.confirmed("t-1", claim, signal.SIGSTOP)
    suspensions.next_round()
    cleared = suspensions.confirmed("t-1", claim, None)  # as it should be now: forgotten
    suspensions.next_round()
    again = suspensions.confirmed("t-1", claim, signal.SIGSTOP)

    assert (first, second, cleared, again) == (False, True, False, False)
