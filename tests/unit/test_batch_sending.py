"""How a batch of task moves goes to PostgreSQL (`transition_writer.sending`): every move
once, its rows locked in task id order, by the moves themselves or by a lock first, in no
more round trips than locking first would take."""

from hypothesis import given
from hypothesis import strategies as st

from shared.store.transition_writer import sending

_BATCHES = st.lists(
    st.tuples(st.text("abcdef", min_size=1, max_size=3), st.sampled_from(["take", "end", "hook"])),
    min_size=2,
    max_size=12,
    unique_by=lambda move: move[0],
)


def test_two_moves_of_two_shapes_go_in_id_order_without_a_lock() -> None:
    assert sending([("t-b", "end"), ("t-a", "take")]) == (False, [[1], [0]])


def test_shapes_that_interleave_are_locked_first_and_each_sent_once() -> None:
    moves = [("t-a", "take"), ("t-b", "end"), ("t-c", "take"), ("t-d", "end")]
    assert sending(moves) == (True, [[0, 2], [1, 3]])


def test_one_shape_back_again_goes_as_three_runs_without_a_lock() -> None:
    moves = [("t-c", "take"), ("t-a", "take"), ("t-b", "end")]
    assert sending(moves) == (False, [[1], [2], [0]])


@given(_BATCHES)
def test_every_batch_locks_its_rows_in_id_order_in_few_round_trips(
    moves: list[tuple[str, str]],
) -> None:
    lock_first, groups = sending(moves)

    sent = [i for group in groups for i in group]
    assert sorted(sent) == list(range(len(moves)))  # every move once
    assert all(len({moves[i][1] for i in group}) == 1 for group in groups)  # one text a group
    shapes = len({text for _, text in moves})
    if lock_first:
        assert len(groups) == shapes
    else:  # the moves themselves lock the rows, in id order
        assert [moves[i][0] for i in sent] == sorted(task_id for task_id, _ in moves)
        assert len(groups) <= shapes + 1
