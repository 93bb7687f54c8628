"""Reading Slurm's answers (`shared/batch/slurm.py`): the lines below are what `squeue -t all -h
-o SQUEUE_FIELDS` printed on the one-node Slurm of `scripts/slurm up` (Slurm 22.05, 2 CPUs)."""

from datetime import datetime

import pytest

from shared.batch.slurm import (
    BatchError,
    parse_duration,
    parse_job_id,
    parse_squeue,
    parse_squeue_line,
    parse_time,
    sbatch_args,
    walltime_minutes,
)

CAPTURED = """\
1|PENDING|N/A|N/A|1:00|None
2|PENDING|N/A|N/A|1:00|PartitionConfig
3|PENDING|N/A|N/A|1:00|Resources
4|PENDING|N/A|N/A|1:00|Priority
5|RUNNING|2026-11-27T11:08:35|2026-11-27T11:09:35|0:59|None
6|FAILED|2026-11-27T11:08:47|2026-11-27T11:08:47|1:00|BadConstraints
7|COMPLETING|2026-11-27T11:08:19|2026-11-27T11:08:26|0:53|None
8|CANCELLED|2026-11-27T11:08:19|2026-11-27T11:08:26|0:53|None
9|COMPLETED|2026-11-27T11:08:16|2026-11-27T11:08:18|0:58|None
10|RUNNING|2026-11-27T11:08:53|2026-11-27T11:09:53|INVALID|None
11|TIMEOUT|2026-11-27T11:08:53|2026-11-27T11:10:08|INVALID|TimeLimit
"""


def local(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone()


def test_every_captured_line_is_read() -> None:
    jobs = parse_squeue(CAPTURED)

    assert list(jobs) == [str(n) for n in range(1, 12)]
    assert [job.state for job in jobs.values()] == [
        "PENDING",
        "PENDING",
        "PENDING",
        "PENDING",
        "RUNNING",
        "FAILED",
        "COMPLETING",
        "CANCELLED",
        "COMPLETED",
        "RUNNING",
        "TIMEOUT",
    ]


def test_a_pending_job_has_its_reason_and_no_start() -> None:
    jobs = parse_squeue(CAPTURED)

    assert [jobs[n].reason for n in "1234"] == [None, "PartitionConfig", "Resources", "Priority"]
    assert all(jobs[n].started_at is None and jobs[n].ends_at is None for n in "1234")
    # While pending, %L is the whole limit, not time left.
    assert all(jobs[n].time_left_s is None for n in "1234")
    assert all(jobs[n].active for n in "1234")


def test_a_running_job_has_its_start_end_and_time_left() -> None:
    job = parse_squeue(CAPTURED)["5"]

    assert job.reason is None
    assert job.started_at == local("2026-11-27T11:08:35")
    assert job.ends_at == local("2026-11-27T11:09:35")
    assert job.started_at is not None and job.started_at.tzinfo is not None
    assert job.time_left_s == 59
    assert job.active


def test_an_ended_job_has_its_end_and_no_time_left() -> None:
    jobs = parse_squeue(CAPTURED)

    assert jobs["9"].ends_at == local("2026-11-27T11:08:18")
    assert jobs["9"].time_left_s is None
    assert jobs["6"].reason == "BadConstraints"
    assert [jobs[n].active for n in "6789"] == [False, True, False, False]


def test_a_job_past_its_walltime() -> None:
    jobs = parse_squeue(CAPTURED)

    # Past its limit, until the controller's sweep ends it, %L says INVALID.
    assert jobs["10"].state == "RUNNING" and jobs["10"].time_left_s is None
    assert jobs["11"].reason == "TimeLimit" and not jobs["11"].active
    assert jobs["11"].ends_at == local("2026-11-27T11:10:08")


def test_a_reason_may_hold_the_separator() -> None:
    job = parse_squeue_line("12|PENDING|N/A|N/A|UNLIMITED|odd|reason")

    assert job.reason == "odd|reason"
    assert job.time_left_s is None


def test_an_unexpected_line_is_a_batch_error() -> None:
    with pytest.raises(BatchError, match="unexpected squeue line"):
        parse_squeue_line("12|PENDING")


def test_an_empty_answer_is_no_jobs() -> None:
    assert parse_squeue("") == {}
    assert parse_squeue("\n") == {}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:59", 59),
        ("1:00", 60),
        ("1:02:03", 3723),
        ("2-01:00:00", 2 * 86400 + 3600),
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
    ],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["N/A", "Unknown", "None", ""])
def test_no_time(text: str) -> None:
    assert parse_time(text) is None


def test_job_ids_of_sbatch_parsable() -> None:
    assert parse_job_id("42\n") == "42"
    assert parse_job_id("42;cluster\n") == "42"
    with pytest.raises(BatchError):
        parse_job_id("\n")


@pytest.mark.parametrize(("seconds", "minutes"), [(0, 1), (1, 1), (60, 1), (61, 2), (3600, 60)])
def test_walltime_in_whole_minutes_rounded_up(seconds: float, minutes: int) -> None:
    assert walltime_minutes(seconds) == minutes


def test_sbatch_args() -> None:
    where = {"workdir": "/w", "output": "/w/%j"}

    bare = sbatch_args(
        name="pilot", cpus=2, memory_mb=None, walltime_s=90, partition=None, account=None, **where
    )
    full = sbatch_args(
        name="pilot",
        cpus=2,
        memory_mb=512,
        walltime_s=90,
        partition="p",
        account="a",
        extra=["--qos=q", "--time=5"],
        **where,
    )

    assert bare == [
        "--parsable",
        "--job-name=pilot",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=2",
        "--time=2",
        "--chdir=/w",
        "--output=/w/%j",
    ]
    # The extra options come last: sbatch takes the last of an option given twice.
    assert full == [*bare, "--mem=512M", "--partition=p", "--account=a", "--qos=q", "--time=5"]
