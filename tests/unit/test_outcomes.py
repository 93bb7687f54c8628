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
    lost_outcome,
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
    # issue 13: a server restart is never the job's fault (hook) nor the host's (quarantine)
    outcome = worker_failed(TaskState.FAILED_ON_CLUSTER, exc, "trace")

    assert outcome.failure_class is FailureClass.PLATFORM
    assert outcome.brief is not None and outcome.brief.startswith("the database went away")
    assert FailureClass.PLATFORM in INFRA and FailureClass.PLATFORM not in BLAMES_HOST


def test_a_files_error_of_the_worker_is_not_taken_for_the_database() -> None:
    exc = PermissionError(errno.EACCES, "Permission denied", "/work/x")
    assert worker_failed(TaskState.FAILED_TO_SETUP, exc, "t").failure_class is FailureClass.HOOK
