"""`vigil tasks`: one line a task, columns aligned, nothing cut, states checked before asking."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from vigil import task_list
from vigil.cli import app
from vigil.cli.tasks import wanted_states
from vigil.errors import UsageError


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (0.4, "0:00"), (61, "1:01"), (3_600, "1:00:00"), (93_784.9, "1-02:03:04")],
)
def test_elapsed_is_shown_as_squeue_shows_it(seconds: float | None, shown: str) -> None:
    assert task_list.elapsed(seconds) == shown


def test_each_task_is_one_line_of_aligned_columns_with_whole_ids() -> None:
    tasks = [
        {"id": "t-aaaaaaaaaaaa", "index": 0, "state": "completed", "host": "h1",
         "elapsed_s": 75.0, "progress": 100, "exit_code": 0, "failure_class": None},
        {"id": "t-bbbbbbbbbbbb", "index": 12, "state": "failed_on_cluster", "host": "host-2",
         "elapsed_s": 3.2, "progress": None, "exit_code": 3, "failure_class": "error_log"},
        {"id": "t-cccccccccccc", "index": 13, "state": "failed_on_cluster", "host": None,
         "elapsed_s": None, "signal": 9, "failure_class": "signal",
         "superseded_by": "t-dddddddddddd"},
        {"id": "t-eeeeeeeeeeee", "index": 14, "state": "new", "host": "\x1b[31mred"},
    ]  # fmt: skip

    header, *rows = list(task_list.lines(tasks))

    starts = [header.index(name) for name in task_list.HEADER]  # every cell under its name
    cells = [
        [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)] for row in rows
    ]
    assert cells == [
        ["t-aaaaaaaaaaaa", "0", "completed", "h1", "1:15", "100%", "0", "-"],
        ["t-bbbbbbbbbbbb", "12", "failed_on_cluster", "host-2", "0:03", "-", "3", "error_log"],
        [
            "t-cccccccccccc", "13", "failed_on_cluster (superseded)", "-", "-", "-", "SIGKILL",
            "signal",
        ],
        ["t-eeeeeeeeeeee", "14", "new", "\\x1b[31mred", "-", "-", "-", "-"],
    ]  # fmt: skip
    assert all(row[start - 2 : start] == "  " for row in rows for start in starts[1:])


def test_states_are_taken_repeated_or_as_a_comma_list_and_checked() -> None:
    assert wanted_states(["on_cpu,queued", " failed_on_cluster ", "on_cpu"]) == [
        "failed_on_cluster", "on_cpu", "queued",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="--state running: not a task state; one of"):
        wanted_states(["on_cpu,running"])


def test_a_state_that_is_not_one_is_refused_before_any_request(tmp_path: Path) -> None:
    env = {"VIGIL_URL": "http://127.0.0.1:9", "VIGIL_CONFIG": "/dev/null", "HOME": str(tmp_path)}

    result = CliRunner().invoke(app, ["tasks", "j-1", "--state", "runing"], env=env)
    not_a_job = CliRunner().invoke(app, ["tasks", "t-1"], env=env)

    assert result.exit_code == 2 and "runing: not a task state" in result.stderr
    assert not_a_job.exit_code == 2 and "tasks takes a job id" in not_a_job.stderr
