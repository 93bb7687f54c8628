"""Hang and walltime judgement from signs of life."""

from shared.domain.states import FailureClass
from shared.domain.vitals import Vitals, verdict


def test_a_command_with_no_limits_is_never_judged() -> None:
    assert verdict(10_000, Vitals(0, 0), None, None) is None


def test_when_silent_past_hang_timeout__it_is_hung() -> None:
    vitals = Vitals(started=0, last_sign=100)
    assert verdict(129, vitals, hang_timeout=30, walltime=None) is None
    outcome = verdict(131, vitals, hang_timeout=30, walltime=None)
    assert outcome is not None and outcome.failure_class is FailureClass.HUNG


def test_a_new_sign_of_life_resets_the_hang_clock_and_an_older_one_does_not() -> None:
    vitals = Vitals(started=0, last_sign=0).seen(50).seen(20).seen(None)
    assert vitals.last_sign == 50
    assert verdict(79, vitals, hang_timeout=30, walltime=None) is None


def test_when_past_walltime__it_is_walltime_even_while_it_talks() -> None:
    vitals = Vitals(started=0, last_sign=0).seen(99)
    outcome = verdict(101, vitals, hang_timeout=30, walltime=100)
    assert outcome is not None and outcome.failure_class is FailureClass.WALLTIME
    assert "100s" in (outcome.brief or "")
