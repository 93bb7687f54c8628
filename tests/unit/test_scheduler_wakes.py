"""What each `vigil_outbox` notification wakes in the scheduler (`services/scheduler/main.py`)."""

import asyncio

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
