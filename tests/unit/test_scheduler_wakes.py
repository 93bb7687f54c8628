"""What each `vigil_outbox` notification wakes in the scheduler (`services/scheduler/main.py`)."""

import asyncio

import pytest

from services.scheduler.due import Due
from services.scheduler.main import _on_notify


def _told(payload: str) -> tuple[bool, bool, bool, list[str]]:
    """(round woken, relay woken, dispatcher told, jobs the finaliser was told of)."""
    round_wake, relay_wake = asyncio.Event(), asyncio.Event()
    release = Due(every_s=2.0)
    release.due(0.0)  # take the first round's look
    release.ran(False, 0.0)
    ended: list[str] = []
    _on_notify(round_wake, relay_wake, release, ended.append, payload)
    return round_wake.is_set(), relay_wake.is_set(), release.due(0.1), ended


def test_a_row_only_the_relay_acts_on_wakes_the_relay_alone() -> None:
    assert _told("relay") == (False, True, False, [])


def test_the_end_of_tasks_tells_the_finaliser_their_jobs_and_wakes_the_round_and_the_relay() -> (
    None
):
    assert _told("ended j-1,j-2") == (True, True, False, ["j-1", "j-2"])


def test_anything_else_wakes_the_round_and_its_dispatcher() -> None:
    assert _told("round") == (True, False, True, [])


def _busy_pool() -> Due:
    """A dispatcher of a pool of 1,600 CPUs whose last look ended at 1.0, after 0.01 s: its
    gap is five looks (0.05 s), and 160 tells make a look due at once."""
    release = Due(every_s=2.0, gap_s=0.1, gap_per_look=5.0, soon_enough=160)
    release.due(0.99)
    release.ran(False, 0.99, 0.01)
    return release


def test_a_round_notification_under_load_waits_for_the_gap_after_the_last_look() -> None:
    release = _busy_pool()
    _on_notify(asyncio.Event(), asyncio.Event(), release, lambda _: None, "round")
    assert not release.due(1.01)
    assert release.soon_in(1.01) == pytest.approx(0.04)
    assert release.due(1.05)


def test_a_round_notification_long_after_the_last_look_is_looked_at_at_once() -> None:
    release = _busy_pool()
    _on_notify(asyncio.Event(), asyncio.Event(), release, lambda _: None, "round")
    assert release.due(5.0)


def test_enough_round_notifications_make_a_look_due_within_the_gap() -> None:
    release = _busy_pool()
    for _ in range(160):
        _on_notify(asyncio.Event(), asyncio.Event(), release, lambda _: None, "round")
    assert release.due(1.001)


def test_on_a_small_pool_a_round_notification_is_looked_at_at_once() -> None:
    release = Due(every_s=2.0, gap_s=0.1, gap_per_look=5.0, soon_enough=1)
    release.due(0.99)
    release.ran(False, 0.99, 0.01)
    _on_notify(asyncio.Event(), asyncio.Event(), release, lambda _: None, "round")
    assert release.due(1.0)
