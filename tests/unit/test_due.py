"""When the round's occasional steps (triage, waiters) look, and how long an idle round waits."""

import pytest

from services.scheduler.due import Due, Pace, gather_wait, relay_wait, soon_enough_for


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


def test_an_idle_round_waits_twice_as_long_each_time_up_to_the_sweep() -> None:
    pace = Pace(tick_s=0.25, max_s=2.0)

    waits = [pace.idle_wait(now=float(n)) for n in range(6)]

    assert waits == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert pace.slowed


def test_the_round_counts_as_slowed_only_while_it_sleeps_longer_than_a_tick() -> None:
    pace = Pace(tick_s=0.25, max_s=2.0)

    pace.idle_wait(now=0.0)
    sleeping_a_tick = pace.slowed
    pace.idle_wait(now=1.0)

    assert not sleeping_a_tick
    assert pace.slowed


def test_when_stirred__the_next_idle_wait_is_the_tick_again() -> None:
    pace = Pace(tick_s=0.25, max_s=2.0)
    for n in range(4):
        pace.idle_wait(now=float(n))

    pace.stir()

    assert not pace.slowed
    assert pace.idle_wait(now=10.0) == 0.25


def test_a_backoff_ending_before_the_wait_would_shortens_it_once() -> None:
    pace = Pace(tick_s=0.25, max_s=2.0)
    for n in range(4):
        pace.idle_wait(now=float(n))  # slowed to 2 s
    pace.due_in(0.5, now=100.0)

    first = pace.idle_wait(now=100.0)
    second = pace.idle_wait(now=100.6)

    assert first == pytest.approx(0.5 + 0.01)  # just after it ends (PostgreSQL's clock)
    assert second == 2.0  # looked at it: forgotten


def test_a_backoff_ending_while_the_round_ran_is_looked_at_again_at_once() -> None:
    pace = Pace(tick_s=0.25, max_s=2.0)
    pace.due_in(0.001, now=50.0)

    assert pace.idle_wait(now=50.0) == pytest.approx(0.011)


def test_backoffs_are_looked_at_earliest_first_and_later_ones_kept() -> None:
    pace = Pace(tick_s=1.0, max_s=8.0)
    pace.due_in(5.0, now=0.0)
    pace.due_in(0.5, now=0.0)

    assert pace.idle_wait(now=0.0) == pytest.approx(0.51)
    assert pace.idle_wait(now=0.6) == 2.0  # the next backoff ends at 5: after this wait
    assert pace.idle_wait(now=2.6) == pytest.approx(2.41)


def test_the_relay_polls_quickly_while_a_worker_may_have_written_quiet_events() -> None:
    # a worker nudges at most every 0.5 s: its quiet events follow a nudge by less than that
    assert relay_wait(0.0, poll_s=0.25, nudge_every_s=0.5) == 0.25
    assert relay_wait(1.2, poll_s=0.25, nudge_every_s=0.5) == 0.25
    assert relay_wait(1.25, poll_s=0.25, nudge_every_s=0.5) == 2.0
    assert relay_wait(60.0, poll_s=5.0, nudge_every_s=0.5) == 5.0  # never faster than asked


def test_the_relay_gathers_after_two_busy_reads_and_not_after_a_quiet_moment() -> None:
    assert gather_wait(9, before=3, gather_s=0.006) == 0.006
    assert gather_wait(1, before=1, gather_s=0.006) == 0.006
    assert gather_wait(9, before=0, gather_s=0.006) == 0.0  # the first after a quiet moment
    assert gather_wait(0, before=9, gather_s=0.006) == 0.0  # nothing left: wait for a wake


def test_a_task_end_is_looked_at_a_gap_after_the_last_look_and_wakes_the_round_then() -> None:
    # given a dispatcher that looks at most every 0.1 s for what task ends freed
    due = Due(every_s=2.0, gap_s=0.1)
    assert due.due(0.0)
    due.ran(False, 0.0)
    # when tasks end 20 ms and 50 ms after its look
    due.tell_soon()
    due.tell_soon()
    # then rounds before the gap do not look, and the round is told to wake at the gap
    assert not due.due(0.02)
    assert due.soon_in(0.05) == pytest.approx(0.05)
    assert due.due(0.1)
    due.ran(False, 0.1)
    # and, both ends taken by that one look, nothing more is wanted
    assert due.soon_in(0.1) is None
    assert not due.due(0.5)


def test_a_tell_is_looked_at_at_once_whatever_the_gap() -> None:
    due = Due(every_s=2.0, gap_s=0.1)
    assert due.due(0.0)
    due.ran(False, 0.0)
    due.tell()  # a submission
    assert due.soon_in(0.01) == 0.0
    assert due.due(0.01)


def test_work_left_is_looked_at_by_a_round_after_the_gap_without_waking_one() -> None:
    # given a pass that left tasks waiting (a throttle: no task end may free them)
    due = Due(every_s=2.0, gap_s=0.1)
    assert due.due(0.0)
    due.ran(True, 0.0)
    # then no round is woken for it, a round within the gap does not look, one after does
    assert due.soon_in(0.0) is None
    assert not due.due(0.05)
    assert due.due(0.15)


def test_the_gap_follows_the_last_looks_own_time_up_to_its_longest() -> None:
    # given a dispatcher whose gap is twice its look's time, at most 0.1 s
    due = Due(every_s=2.0, gap_s=0.1, gap_per_look=2.0)
    assert due.due(0.0)
    due.ran(False, 0.0, took_s=0.003)  # a look of 3 ms
    due.tell_soon()
    # then a task's end is looked at 6 ms after the look ended
    assert not due.due(0.008)
    assert due.soon_in(0.004) == pytest.approx(0.005)
    assert due.due(0.0095)
    due.ran(False, 0.0095, took_s=0.2)  # a look of 0.2 s: the gap is at its longest
    due.tell_soon()
    assert not due.due(0.3)
    assert due.due(0.31)


def test_enough_task_ends_are_looked_at_at_once_whatever_the_gap() -> None:
    # given a dispatcher with a gap, looking at once after 2 ends (a pool of 11 to 20 CPUs)
    due = Due(every_s=2.0, gap_s=0.1, soon_enough=soon_enough_for(20))
    assert due.due(0.0)
    due.ran(False, 0.0)
    # when one task ends, the gap holds; when a second does, the next round looks
    due.tell_soon()
    assert not due.due(0.01)
    due.tell_soon()
    assert due.soon_in(0.01) == 0.0
    assert due.due(0.01)
    due.ran(False, 0.01)
    assert due.soon_in(0.02) is None  # both taken by that look


def test_a_pool_of_two_cpus_looks_at_every_task_end() -> None:
    assert soon_enough_for(2) == 1 and soon_enough_for(0) == 1
    assert soon_enough_for(1600) == 160


def test_a_pool_where_one_end_is_enough_has_no_gap_for_work_left() -> None:
    # given a pool of two CPUs: one end is enough for a look
    due = Due(every_s=2.0, gap_s=0.1, gap_per_look=2.0, soon_enough=soon_enough_for(2))
    assert due.due(0.0)
    due.ran(True, 0.0, took_s=0.01)  # work left waiting
    # then the next round looks, as without a gap
    assert due.gap() == 0.0
    assert due.due(0.011)
