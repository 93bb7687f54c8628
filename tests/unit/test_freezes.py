"""What a command owes its job's suspension (a lost FreezeTask made good at a reconcile)."""

import signal

import pytest

from services.supervisor.freezes import owed


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
