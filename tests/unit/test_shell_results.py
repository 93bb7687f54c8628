"""`shell` says when its `save_results` has nothing to do: exactly when it would return True
and record no output (the worker then ends the task at the command's exit in one move)."""

from pathlib import Path

import pytest

from shared.domain.status_report import StatusReport
from shared.task_types.base import TaskContext
from shared.task_types.shell import ShellTaskType


def _ctx(
    tmp_path: Path, exit_code: int, status: StatusReport | None, outputs: list[str]
) -> TaskContext:
    return TaskContext(
        job_id="j-1",
        task_id="t-1",
        index=0,
        input="x",
        workdir=tmp_path,
        attempt=3,
        run_number=1,
        command="true",
        outputs=outputs,
        exit_code=exit_code,
        status=status,
    )


@pytest.mark.parametrize(
    ("exit_code", "status", "outputs", "saved"),
    [
        (0, None, [], True),
        (0, StatusReport(status="success"), [], True),
        (0, StatusReport(status="fatal", message="no"), [], False),
        (0, StatusReport(status="recoverable"), [], False),
        (1, None, [], False),
        (0, None, ["out.txt"], False),  # an output to record: save_results has work
    ],
)
def test_results_are_saved_exactly_when_save_results_would_succeed_recording_nothing(
    tmp_path: Path,
    exit_code: int,
    status: StatusReport | None,
    outputs: list[str],
    saved: bool,
) -> None:
    shell = ShellTaskType()
    for name in outputs:
        (tmp_path / name).write_text("done\n")

    assert shell.results_are_saved(_ctx(tmp_path, exit_code, status, outputs)) is saved
    if saved:  # then save_results agrees, and records nothing
        ctx = _ctx(tmp_path, exit_code, status, outputs)
        assert shell.save_results(ctx) is True and ctx.recorded == {}


def test_a_declared_output_the_command_never_wrote_is_named_as_why_the_results_failed(
    tmp_path: Path,
) -> None:
    (tmp_path / "made.txt").write_text("done\n")
    one = _ctx(tmp_path, 0, None, ["made.txt", "out.dat"])
    two = _ctx(tmp_path, 0, None, ["out.dat", "log.txt"])

    assert ShellTaskType().save_results(one) is False
    assert ShellTaskType().save_results(two) is False

    assert one.why_failed == "output out.dat was not written"
    assert two.why_failed == "outputs out.dat, log.txt were not written"
