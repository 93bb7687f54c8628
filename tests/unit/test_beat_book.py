"""A service's book of beats through Redis (`shared/host/beats.py`): which answer renews its
lease, and when it beats PostgreSQL itself."""

from shared.host.beats import BeatBook
from shared.messaging.beat_board import Answer


def test_the_first_beat_goes_to_postgresql_and_the_next_ones_through_redis() -> None:
    book = BeatBook(probe_every_s=10)
    assert not book.through_redis(100.0)
    book.reached(100.0)
    assert book.through_redis(110.0) and book.through_redis(120.0)


def test_two_probe_periods_without_reaching_postgresql_end_the_beats_through_redis() -> None:
    book = BeatBook(probe_every_s=10)
    book.reached(100.0)
    assert not book.probe_due(109.0) and book.probe_due(110.0)
    assert not book.through_redis(120.5)
    book.reached(90.0)  # an older statement's success moves nothing back
    assert book.reached_at == 100.0


def test_an_answer_renews_as_of_the_sending_of_the_beat_it_answers() -> None:
    book = BeatBook(probe_every_s=10)
    book.next(1.0)
    book.next(3.5)
    assert book.answered(Answer("w1", 1, []), "w1") == 1.0
    book.next(6.0)
    assert book.answered(Answer("w1", 2, []), "w1") == 3.5
    for at in range(7, 100):  # answers that never come: only the last two beats are kept
        book.next(float(at))
    assert book.sent == {95: 98.0, 96: 99.0}


def test_an_answer_too_old_or_for_another_instance_renews_nothing() -> None:
    book = BeatBook(probe_every_s=10)
    for at in (1.0, 2.0, 3.0):
        book.next(at)
    assert book.answered(Answer("w1", 1, []), "w1") is None  # the beat before last's
    assert book.answered(Answer("w0", 2, []), "w1") is None  # a former instance's
    assert book.answered(None, "w1") is None


def test_an_answer_the_book_cannot_read_is_none() -> None:
    assert Answer.decode("not json") is None
    assert Answer.decode('["w1", "2", []]') is None
    assert Answer.decode(Answer("w1", 2, [False, False, False, 1]).encode()) == Answer(
        "w1", 2, [False, False, False, 1]
    )
