"""When the round's occasional steps (triage, waiters) look."""

from services.scheduler.due import Due


def test_the_first_round_looks_then_only_when_told_or_at_the_sweep() -> None:
    due = Due(every_s=2.0)
    assert due.due(0.0)
    due.ran(False, 0.0)
    assert not due.due(1.0)
    due.tell()
    assert due.due(1.0)
    due.ran(False, 1.0)
    assert not due.due(2.9)
    assert due.due(3.0)


def test_a_pass_that_left_work_looks_again_at_once() -> None:
    due = Due(every_s=2.0)
    assert due.due(0.0)
    due.ran(True, 0.0)
    assert due.due(0.1)
    due.ran(False, 0.1)
    assert not due.due(0.2)


def test_a_tell_during_a_pass_is_not_lost_when_it_ends() -> None:
    due = Due(every_s=2.0)
    assert due.due(0.0)
    due.tell()  # the relay saw a failure while the triage was reading
    due.ran(False, 0.0)
    assert due.due(0.1)
