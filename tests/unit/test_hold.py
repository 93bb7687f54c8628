"""The stages of a task held by a worker (`services.worker.claims.Hold`): a take written
only with the `on_cpu` move, then set up, queued, run; each move one the table allows."""

import itertools

import pytest

from services.worker.claims import HOLD_MOVES, PROMISES, Hold, check_hold


def test_a_promised_take_is_written_before_anything_else_is() -> None:
    # set up in the worker only, then written with the on_cpu move (or the general way)
    for path in (
        (Hold.PROMISED, Hold.PROMISED_SET_UP, Hold.OPENED, Hold.HELD),
        (Hold.PROMISED, Hold.PROMISED_SET_UP, Hold.SET_UP, Hold.HELD, Hold.OPENED),
        (Hold.PROMISED, Hold.OPENED, Hold.HELD),
        (Hold.PROMISED, Hold.HELD),  # a hook's take, or one that adopts a resting task
    ):
        for src, dst in itertools.pairwise(path):
            check_hold(src, dst)


def test_no_hold_goes_back_to_a_promise() -> None:
    for src in Hold:
        for dst in PROMISES - {Hold.PROMISED_SET_UP}:
            with pytest.raises(ValueError, match="cannot go"):
                check_hold(src, dst)
    with pytest.raises(ValueError, match="cannot go"):
        check_hold(Hold.HELD, Hold.PROMISED_SET_UP)


def test_an_attempt_opened_for_a_stage_is_taken_by_it_before_the_stage_sets_up() -> None:
    with pytest.raises(ValueError, match="cannot go from opened to set_up"):
        check_hold(Hold.OPENED, Hold.SET_UP)
    check_hold(Hold.OPENED, Hold.HELD)
    check_hold(Hold.HELD, Hold.SET_UP)


def test_every_hold_has_its_moves_and_each_leads_to_a_hold() -> None:
    assert set(HOLD_MOVES) == set(Hold)
    assert all(moves <= set(Hold) and moves for moves in HOLD_MOVES.values())
