"""Pure decisions about how an attempt ended: its next state, failure class and brief."""

import errno
import signal as signals
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from shared.domain.errors import connection_lost
from shared.domain.log_lines import shell_killed, shell_refusal
from shared.domain.messages import JobEvent, JobOutcome
from shared.domain.states import FailureClass, TaskState, failure_state_for
from shared.domain.status_report import StatusReport


@dataclass(frozen=True)
class Outcome:
    """Where a task goes after an attempt, and why."""

    state: TaskState
    failure_class: FailureClass | None = None
    exit_code: int | None = None
    signal: int | None = None
    brief: str | None = None
    detail: str | None = None

    @property
    def crashed(self) -> bool:
        """A crash (signal or lost) is announced as `job.crashed.<job id>`."""
        return self.failure_class in (FailureClass.SIGNAL, FailureClass.LOST)

    def changes(self) -> dict[str, object]:
        """The task columns this outcome sets (an exit code or signal already known is kept)."""
        changes: dict[str, object] = {
            "failure_class": self.failure_class,
            "error_brief": self.brief,
            "error_detail": self.detail,
        }
        if self.exit_code is not None:
            changes["exit_code"] = self.exit_code
        if self.signal is not None:
            changes["signal"] = self.signal
        return changes

    def job_event(self, job_id: str, task_id: str) -> JobEvent | None:
        """What a supervisor-detected failure announces at once: `job.crashed` (signal, lost),
        `job.hung`, or `job.failed` (error log, walltime); nothing for the rest (`job.failed`
        comes when the job ends)."""
        outcome = _ANNOUNCED.get(self.failure_class) if self.failure_class else None
        if outcome is None:
            return None
        return JobEvent(job_id=job_id, outcome=outcome, task_id=task_id, brief=self.brief)


_ANNOUNCED = {
    FailureClass.SIGNAL: JobOutcome.CRASHED,
    FailureClass.LOST: JobOutcome.CRASHED,
    FailureClass.HUNG: JobOutcome.HUNG,
    FailureClass.ERROR_LOG: JobOutcome.FAILED,
    FailureClass.WALLTIME: JobOutcome.FAILED,
}


def signal_name(number: int) -> str:
    """`SIGKILL` for 9; `signal 64` for a number with no name."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


#: What bash exits with when it cannot parse the script (as for a misused builtin).
SHELL_SYNTAX_EXIT: Final = 2


#: What a shell exits with when it found a command but could not run it, and when it found none.
NOT_EXECUTABLE_EXIT: Final = 126
NOT_FOUND_EXIT: Final = 127


def command_outcome(
    returncode: int,
    status: StatusReport | None,
    syntax_error: str | None = None,
    *,
    refusal: str | None = None,
    not_executable: Collection[str] = (),
) -> Outcome:
    """How the command's exit status (negative = killed by that signal) ends the cluster stage.

    `syntax_error`: the stderr line in which bash said it could not parse the script
    (`shared.domain.log_lines.shell_syntax_error`); with exit 2 the brief names it.
    `refusal`: the last stderr line in which a shell said it could not run a command
    (`shell_refusal`); with exit 126 or 127 the brief names that command, and a file of the
    job's among `not_executable` (their paths) as what lacks `executable` in `files`."""
    if returncode < 0:
        sig = -returncode
        return Outcome(
            TaskState.FAILED_ON_CLUSTER,
            FailureClass.SIGNAL,
            signal=sig,
            brief=f"command killed by {signal_name(sig)}",
        )
    if returncode > 0:
        brief = f"command exited with code {returncode}"
        if returncode == SHELL_SYNTAX_EXIT and syntax_error is not None:
            brief += f": a shell syntax error: {syntax_error[:500]}"
        elif returncode in (NOT_EXECUTABLE_EXIT, NOT_FOUND_EXIT) and refusal is not None:
            brief += f": {_refused(refusal, not_executable)}"
        if status is not None and status.message:
            brief += f": {status.message}"
        return Outcome(
            TaskState.FAILED_ON_CLUSTER, FailureClass.EXIT, exit_code=returncode, brief=brief
        )
    return Outcome(TaskState.DATA_READY, exit_code=0)


def _refused(line: str, not_executable: Collection[str]) -> str:
    """What a shell's refusal to run a command says, naming the job's file at fault."""
    refusal = shell_refusal(line)
    if refusal is None:
        return line[:500]
    if refusal.why == "command not found":
        return f"command not found: {refusal.command[:200]} ({line[:500]})"
    command = refusal.command.removeprefix("./")
    for path in not_executable:
        if command == path or command.endswith(f"/{path}"):
            return (
                f'{path} is not executable: give it "executable": true in the job\'s'
                f" files ({line[:500]})"
            )
    return line[:500]


def limit_outcome(returncode: int, memory_bytes: int | None, killed: str | None = None) -> Outcome:
    """The kernel killed the command, or one of its processes, for going over the task's own
    memory limit: the job's failure, never the host's (design §5), even when the command went
    on to exit 0 (as Slurm's OUT_OF_MEMORY: its results may lack what the killed process was
    to make). `killed`: the line in which bash named a killed process (`shell_killed`)."""
    limit = f" of {memory_bytes // 2**20} MiB" if memory_bytes else ""
    victim = shell_killed(killed) if killed is not None else None
    if victim is not None:
        who = f"`{victim[:200]}`"
    else:
        who = "its command" if returncode < 0 else "one of its processes"
    brief = (
        f"killed by the kernel: over the task's memory limit{limit}"
        f" (policy.limits.memory_mb): the OOM killer ended {who}"
    )
    if returncode == 0:
        brief += (
            "; the command still exited 0 (policy.limits.tolerate_oom_kills: true lets such"
            " a task complete)"
        )
    return Outcome(
        TaskState.FAILED_ON_CLUSTER,
        FailureClass.LIMIT,
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        brief=brief,
    )


def results_refused(why: str | None, status: StatusReport | None) -> Outcome:
    """`save_results` returned False after the command exited 0: the application's failure
    (class `exit`). `why`: what the task type said of why (`TaskContext.why_failed`, as
    `output out.dat was not written`), else only that it refused."""
    brief = why or "save_results() returned False"
    if status is not None and status.status != "success":
        brief += f": status file says {status.status}: {status.message}"
    detail = f"save_results() returned False: {brief}" if why else None
    return Outcome(TaskState.FAILED_ON_CLUSTER, FailureClass.EXIT, brief=brief, detail=detail)


def vanished_outcome() -> Outcome:
    """A watched process died and its worker did not report how: a signal nobody in Vigil sent."""
    return Outcome(
        TaskState.FAILED_ON_CLUSTER,
        FailureClass.SIGNAL,
        brief="process died without its worker reporting an exit (killed from outside?)",
    )


def hung_outcome(silent_s: float) -> Outcome:
    """No output (or status file) for longer than the job's `hang_timeout`."""
    return Outcome(
        TaskState.FAILED_ON_CLUSTER,
        FailureClass.HUNG,
        brief=f"no sign of life for {silent_s:.1f}s (hang_timeout): process tree killed",
    )


def walltime_outcome(walltime_s: float) -> Outcome:
    """The command ran longer than the job's `walltime`."""
    return Outcome(
        TaskState.FAILED_ON_CLUSTER,
        FailureClass.WALLTIME,
        brief=f"ran past its walltime of {walltime_s:g}s: process tree killed",
    )


def error_log_outcome(severity: str, line: str, returncode: int | None = None) -> Outcome:
    """The command logged a record whose severity is in the job's `fail_on_log`.

    `returncode`: how the command had ended by then on its own, if it had (negative: the
    signal that killed it); its exit code or signal is kept beside the class."""
    return Outcome(
        TaskState.FAILED_ON_CLUSTER,
        FailureClass.ERROR_LOG,
        exit_code=returncode if returncode is not None and returncode >= 0 else None,
        signal=-returncode if returncode is not None and returncode < 0 else None,
        brief=f"{severity} logged: {line[:500]}",
    )


def lost_outcome(state: TaskState, why: str) -> Outcome:
    """The task's worker (or host) is gone while holding it in `state`."""
    return Outcome(failure_state_for(state), FailureClass.LOST, brief=why)


#: What an `OSError` says when the host's disk, not the job, is at fault.
DISK_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def _disk_refusal(exc: BaseException) -> str | None:
    """`no space left on device on /path` (& co.) when `exc` is the host's disk refusing."""
    if not isinstance(exc, OSError) or exc.errno not in DISK_ERRNOS:
        return None
    reason = (exc.strerror or str(exc)).lower()
    return f"{reason} on {exc.filename}" if exc.filename else reason


def hook_failed(
    state: TaskState, hook: str, exc: BaseException | None, detail: str | None
) -> Outcome:
    """A hook raised (`exc`) or returned False (`exc` is None). A disk that refused the
    task's files (full, over quota, read-only) is the host's failure, class `host`."""
    if exc is None:
        return Outcome(state, FailureClass.HOOK, brief=f"{hook}() returned False")
    disk = _disk_refusal(exc)
    if disk is not None:
        return Outcome(
            state, FailureClass.HOST, brief=f"{hook}(): the host's disk: {disk}", detail=detail
        )
    return Outcome(
        state,
        FailureClass.HOOK,
        brief=f"{hook}() raised {type(exc).__name__}: {exc}",
        detail=detail,
    )


def worker_failed(state: TaskState, exc: BaseException, detail: str) -> Outcome:
    """The worker hit an error of its own while driving a task in `state`: class `hook`,
    `host` when it was the host's disk refusing the task's files, `platform` when the database
    went away under its bookkeeping (a restart: the platform's fault, never the job's)."""
    disk = _disk_refusal(exc)
    if disk is not None:
        return Outcome(state, FailureClass.HOST, brief=f"the host's disk: {disk}", detail=detail)
    if connection_lost(exc):
        brief = f"the database went away under the worker: {type(exc).__name__}: {exc}"
        return Outcome(state, FailureClass.PLATFORM, brief=brief, detail=detail)
    return Outcome(
        state, FailureClass.HOOK, brief=f"worker error: {type(exc).__name__}: {exc}", detail=detail
    )
