"""How an attempt's end is classified (design §5 failure classes)."""

import errno
import os
import signal

import asyncpg
import pytest

from shared.domain.analyser import BLAMES_HOST, INFRA
from shared.domain.messages import JobOutcome
from shared.domain.outcomes import (
    command_outcome,
    error_log_outcome,
    hook_failed,
    limit_outcome,
    lost_outcome,
    results_refused,
    vanished_outcome,
    worker_failed,
)
from shared.domain.states import FailureClass, TaskState
from shared.domain.status_report import StatusReport


def test_exit_0_makes_the_data_ready() -> None:
    outcome = command_outcome(0, None)
    assert (outcome.state, outcome.failure_class, outcome.exit_code) == (
        TaskState.DATA_READY, None, 0,
    )  # fmt: skip


def test_a_non_zero_exit_is_class_exit_with_the_code_and_the_status_message() -> None:
    outcome = command_outcome(3, StatusReport(status="fatal", message="disk full"))
    assert (outcome.state, outcome.failure_class, outcome.exit_code) == (
        TaskState.FAILED_ON_CLUSTER, FailureClass.EXIT, 3,
    )  # fmt: skip
    assert outcome.brief == "command exited with code 3: disk full"
    assert outcome.job_event("j-1", "t-1") is None


def test_exit_2_with_bashs_syntax_error_line_is_named_a_shell_syntax_error() -> None:
    said = "bash: -c: line 1: unexpected EOF while looking for matching `\"'"

    parse_error = command_outcome(2, None, said)
    other_code = command_outcome(1, None, said)  # a line of the command's own, then exit 1

    assert (parse_error.failure_class, parse_error.exit_code) == (FailureClass.EXIT, 2)
    assert parse_error.brief == f"command exited with code 2: a shell syntax error: {said}"
    assert other_code.brief == "command exited with code 1"
    assert command_outcome(2, None).brief == "command exited with code 2"


def test_outputs_not_written_fail_as_the_applications_exit_naming_them() -> None:
    named = results_refused("output out.dat was not written", None)
    unnamed = results_refused(None, StatusReport(status="fatal", message="bad input"))

    assert (named.state, named.failure_class) == (TaskState.FAILED_ON_CLUSTER, FailureClass.EXIT)
    assert named.brief == "output out.dat was not written"
    assert named.detail is not None and "output out.dat was not written" in named.detail
    assert unnamed.brief == "save_results() returned False: status file says fatal: bad input"


def test_exit_127_names_the_command_bash_did_not_find() -> None:
    said = "bash: line 1: frobnicate: command not found"

    outcome = command_outcome(127, None, refusal=said)

    assert (outcome.failure_class, outcome.exit_code) == (FailureClass.EXIT, 127)
    assert outcome.brief == f"command exited with code 127: command not found: frobnicate ({said})"


@pytest.mark.parametrize("called", ["./bin/run.sh", "bin/run.sh", "/work/j-1/t-1/bin/run.sh"])
def test_exit_126_on_a_job_file_without_its_exec_bit_names_it_and_the_executable_flag(
    called: str,
) -> None:
    said = f"bash: line 1: {called}: Permission denied"

    outcome = command_outcome(126, None, refusal=said, not_executable=["bin/run.sh", "in.txt"])
    elsewhere = command_outcome(126, None, refusal="bash: /opt/x: Permission denied")

    assert outcome.brief is not None
    assert outcome.brief.startswith("command exited with code 126: bin/run.sh is not executable")
    assert '"executable": true in the job\'s files' in outcome.brief
    assert elsewhere.brief == "command exited with code 126: bash: /opt/x: Permission denied"


def test_a_refusal_line_is_not_the_cause_of_another_exit_code() -> None:
    said = "bash: line 1: frobnicate: command not found"
    assert command_outcome(1, None, refusal=said).brief == "command exited with code 1"


def test_an_oom_kill_of_any_process_is_class_limit_naming_it_even_after_exit_0() -> None:
    killed = "bash: line 1:  4242 Killed                  python3 hog.py"

    survived = limit_outcome(0, 64 * 2**20, killed)
    main = limit_outcome(-signal.SIGKILL, 64 * 2**20)

    assert (survived.state, survived.failure_class) == (
        TaskState.FAILED_ON_CLUSTER, FailureClass.LIMIT,
    )  # fmt: skip
    assert (survived.exit_code, survived.signal) == (0, None)
    assert survived.brief is not None and "`python3 hog.py`" in survived.brief
    assert "over the task's memory limit of 64 MiB" in survived.brief
    assert "tolerate_oom_kills" in survived.brief
    assert main.brief is not None and "ended its command" in main.brief
    assert (main.exit_code, main.signal) == (None, signal.SIGKILL)


def test_a_signal_is_class_signal_named_and_announced_as_a_crash() -> None:
    outcome = command_outcome(-signal.SIGSEGV, None)
    assert (outcome.failure_class, outcome.signal) == (FailureClass.SIGNAL, signal.SIGSEGV)
    assert outcome.brief == "command killed by SIGSEGV"
    event = outcome.job_event("j-1", "t-1")
    assert event is not None and event.outcome is JobOutcome.CRASHED


def test_an_error_log_keeps_how_the_command_ended_beside_its_class() -> None:
    exited = error_log_outcome("error", "ERROR: no input", 3)
    killed = error_log_outcome("fatal", "FATAL: bye", -signal.SIGABRT)
    running = error_log_outcome("error", "ERROR: still going")

    assert (exited.failure_class, exited.exit_code, exited.signal) == (
        FailureClass.ERROR_LOG, 3, None,
    )  # fmt: skip
    assert exited.brief == "error logged: ERROR: no input"
    assert (killed.exit_code, killed.signal) == (None, signal.SIGABRT)
    assert (running.exit_code, running.signal) == (None, None)  # killed by its verdict
    assert exited.changes()["exit_code"] == 3


def test_a_lost_worker_fails_the_stage_it_held_and_crashes_the_job() -> None:
    outcome = lost_outcome(TaskState.SETTING_UP, "worker died")
    assert (outcome.state, outcome.failure_class) == (TaskState.FAILED_TO_SETUP, FailureClass.LOST)
    assert outcome.crashed


def test_a_vanished_process_is_a_signal_nobody_in_vigil_sent() -> None:
    assert vanished_outcome().failure_class is FailureClass.SIGNAL


def test_a_hook_that_raised_keeps_the_traceback_and_one_that_said_false_says_so() -> None:
    raised = hook_failed(TaskState.FAILED_TO_SETUP, "setup", ValueError("bad"), "Traceback...")
    assert raised.brief == "setup() raised ValueError: bad" and raised.detail == "Traceback..."
    refused = hook_failed(TaskState.FAILED_TO_SETUP, "setup", None, None)
    assert refused.brief == "setup() returned False" and refused.detail is None


def test_changes_keep_an_exit_code_already_known() -> None:
    assert "exit_code" not in command_outcome(-9, None).changes()
    assert command_outcome(2, None).changes()["exit_code"] == 2


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.ENOSPC, "no space left on device on /work/j-1/t-1/input.json"),
        (errno.EROFS, "read-only file system on /work/j-1/t-1/input.json"),
        (errno.EDQUOT, "quota exceeded on /work/j-1/t-1/input.json"),
    ],
)
def test_a_disk_that_refuses_the_tasks_files_is_the_hosts_failure_not_the_jobs(
    code: int, says: str
) -> None:
    exc = OSError(code, os.strerror(code), "/work/j-1/t-1/input.json")

    hook = hook_failed(TaskState.FAILED_TO_SETUP, "setup", exc, "trace")
    worker = worker_failed(TaskState.FAILED_TO_SETUP, exc, "trace")

    for outcome in (hook, worker):
        assert outcome.failure_class is FailureClass.HOST
        assert outcome.brief is not None and says in outcome.brief.lower()
    assert FailureClass.HOST in INFRA and FailureClass.HOST in BLAMES_HOST


def test_any_other_error_of_a_hook_or_the_worker_stays_a_hook_failure() -> None:
    exc = PermissionError(errno.EACCES, "Permission denied", "/work/x")
    assert hook_failed(TaskState.FAILED_TO_SETUP, "setup", exc, None).failure_class is (
        FailureClass.HOOK
    )
    worker = worker_failed(TaskState.FAILED_ON_CLUSTER, ValueError("bad"), "trace")
    assert (worker.failure_class, worker.brief) == (
        FailureClass.HOOK,
        "worker error: ValueError: bad",
    )


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.InterfaceError(
            "cannot call Transaction.__aexit__(): the underlying connection is closed"
        ),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"),
    ],
)
def test_a_database_gone_under_the_workers_bookkeeping_is_the_platforms_failure(
    exc: Exception,
) -> None:
    # a server restart is never the job's fault (hook) nor the host's (quarantine)
    outcome = worker_failed(TaskState.FAILED_ON_CLUSTER, exc, "trace")

    assert outcome.failure_class is FailureClass.PLATFORM
    assert outcome.brief is not None and outcome.brief.startswith("the database went away")
    assert FailureClass.PLATFORM in INFRA and FailureClass.PLATFORM not in BLAMES_HOST


def test_a_files_error_of_the_worker_is_not_taken_for_the_database() -> None:
    exc = PermissionError(errno.EACCES, "Permission denied", "/work/x")
    assert worker_failed(TaskState.FAILED_TO_SETUP, exc, "t").failure_class is FailureClass.HOOK
