"""The dashboard's charts: buckets over time, series binned into them, columns and histograms as
rectangles of the drawing; which events count for what."""

import json
from datetime import UTC, datetime, timedelta

from services.api import charts
from shared.store import activity

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


def test_an_hour_is_sixty_one_minute_buckets_and_a_day_is_cut_into_wider_ones() -> None:
    hour, minute = charts.buckets(T0, T0 + timedelta(hours=1))
    day, wide = charts.buckets(T0 + timedelta(seconds=30), T0 + timedelta(days=1))

    assert (len(hour), minute, hour[0], hour[-1]) == (
        60,
        timedelta(minutes=1),
        T0,
        T0 + timedelta(minutes=59),
    )
    assert wide == timedelta(minutes=24) and len(day) == 60 and day[0] == T0  # minute-aligned


def test_rows_are_summed_into_their_series_bucket_and_strangers_are_left_out() -> None:
    starts, width = charts.buckets(T0, T0 + timedelta(minutes=10))
    rows = [
        (T0, "state:failed_on_cluster", 2),
        (T0, "state:failed_to_setup", 1),
        (T0 + timedelta(minutes=3), "state:completed", 5),
        (T0 + timedelta(minutes=3), "state:queued", 9),  # in no series
        (T0 + timedelta(hours=2), "state:completed", 7),  # out of the span
    ]

    values = charts.binned(
        rows,
        starts,
        width,
        {
            "failed": ["state:failed_on_cluster", "state:failed_to_setup"],
            "completed": ["state:completed"],
        },
    )

    assert values["failed"][0] == 3 and sum(values["failed"]) == 3
    assert values["completed"][3] == 5 and sum(values["completed"]) == 5


def test_side_by_side_columns_share_a_bucket_and_the_tallest_reaches_the_top() -> None:
    starts = [T0, T0 + timedelta(minutes=1)]

    chart = charts.columns("c", "t", starts, {"a": [4, 0], "b": [2, 1]}, stacked=False)

    assert chart.top == 4
    a, b, b2 = chart.rects
    assert (a.series, a.height, a.y) == ("a", charts.HEIGHT, 0)
    assert b.x == a.x + a.width and b.height == charts.HEIGHT / 2
    assert b2.x > b.x and b2.title == "10:01: 1 b"


def test_stacked_columns_pile_up_to_their_total() -> None:
    chart = charts.columns("c", "t", [T0], {"exit": [1], "signal": [3]}, stacked=True)

    exit_, signal = chart.rects
    assert chart.top == 4
    assert exit_.y + exit_.height == charts.HEIGHT  # the first at the bottom
    assert signal.y + signal.height == exit_.y and signal.y == 0


def test_a_histogram_bins_run_times_from_zero_to_the_longest() -> None:
    chart = charts.histogram("h", "t", [0.1, 0.1, 0.2, 2.0])

    assert chart.top == 2 and chart.right_label == "2 s"
    assert [r.title for r in chart.rects] == [
        "2 runs of 100 ms to 200 ms",
        "1 runs of 200 ms to 300 ms",
        "1 runs of 1.9 s to 2 s",
    ]
    assert charts.histogram("h", "t", []).empty


def test_task_events_count_per_job_and_for_the_whole_system() -> None:
    failed = json.dumps({"failure_class": "signal"}).encode()

    assert activity.kinds("task.on_cpu.j-1", b"{}") == [("j-1", "state:on_cpu"), ("", "started")]
    assert activity.kinds("task.failed_on_cluster.j-1", failed) == [
        ("j-1", "state:failed_on_cluster"),
        ("", "ended"),
        ("", "failed:signal"),
    ]
    assert activity.kinds("task.completed.j-1", b"{}")[-1] == ("", "ended")
    assert activity.kinds("task.queued.j-1", b"{}") == []  # a passing state: not charted
    assert activity.kinds("job.succeeded.j-1", b"{}") == []
    assert activity.kinds("task.resubmitted.j-1", b"{}") == []  # a decision, not a state
    assert activity.kinds("host.quarantined.h1", b"{}") == []


def test_a_tally_counts_per_minute() -> None:
    tally = activity.Tally()

    tally.count("task.on_cpu.j-1", b"{}", T0 + timedelta(seconds=5))
    tally.count("task.on_cpu.j-1", b"{}", T0 + timedelta(seconds=55))
    tally.count("task.on_cpu.j-1", b"{}", T0 + timedelta(seconds=65))

    assert tally.counts[("", T0, "started")] == 2
    assert tally.counts[("j-1", T0 + timedelta(minutes=1), "state:on_cpu")] == 1


def test_the_last_hour_from_any_second_is_sixty_buckets_of_a_minute() -> None:
    now = T0 + timedelta(minutes=30, seconds=42)
    start = now.replace(second=0) - timedelta(minutes=59)

    starts, width = charts.buckets(start, now)

    assert (len(starts), width, starts[-1]) == (
        60,
        timedelta(minutes=1),
        T0 + timedelta(minutes=30),
    )
