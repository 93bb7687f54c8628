"""Running a command: bash in its own session, output read line by line, exit awaited.

The command is started off the event loop (`subprocess.Popen` in a thread): the loop does not
stand still while the kernel makes the process (a vfork waits for the child's exec, and under
load that took a millisecond or more of every spawn, with every slot's bookkeeping behind it).
Its pipes are then read by the loop, and its exit seen through a pidfd.
"""

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

from shared.host import cgroups
from shared.host.processes import create_time, signal_tree
from shared.objects import STORE_CREDENTIALS

_CHUNK: Final = 65536
#: Variables of the worker that a command must not see: service wiring and credentials,
#: Vigil's and the object store's (`AWS_*`, which a worker of a signed store holds none of).
_HIDDEN_PREFIXES: Final = ("VIGIL_", *STORE_CREDENTIALS)

LineSink = Callable[[Literal["stdout", "stderr"], str], None]
ExitNote = Callable[[int], Awaitable[None]]


#: What bash sources before the script (through `BASH_ENV`, which a non-interactive bash reads
#: before its `-c` string): wait for a line on stdin, the gate's pipe (EOF: the worker is gone or
#: gave up, so the script never runs), then give the script /dev/null as stdin, a umask that
#: keeps what it makes its own (077), and hide the gate. One bash per command, and the script
#: stays `bash -c <script>` ($0, arguments, parsing).
GATE_SCRIPT: Final = "IFS= read -r _ || exit 125; exec 0</dev/null; umask 077; unset BASH_ENV\n"


@functools.cache
def _gate_file() -> Path:
    """The gate script, written once per process into a directory only we can write (and
    remove at exit)."""
    directory = Path(tempfile.mkdtemp(prefix="vigil-gate-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    directory.chmod(0o755)
    path = directory / "gate.sh"
    path.write_text(GATE_SCRIPT)
    path.chmod(0o444)
    return path


class Child:
    """A child process started off the loop: its output pipes as stream readers, its exit
    awaited through a pidfd, then reaped (the shape of `asyncio.subprocess.Process` we use)."""

    def __init__(
        self,
        popen: "subprocess.Popen[bytes]",
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout, self.stderr = stdout, stderr
        self._exited: asyncio.Future[None] | None = None
        #: The read end of the pipe a sealed command's pid 1 reports bash's wait status to.
        self.report: int | None = None
        self._reported: int | None = None

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (negative: the signal that killed it)."""
        if self._reported is not None:
            return self._reported
        if self._popen.returncode is None or self.report is None:
            return self._popen.returncode
        if self._reported is None:
            self._reported = reported_status(_read_report(self.report), self._popen.returncode)
            os.close(self.report)
            self.report = None
        return self._reported

    async def wait(self) -> int:
        """Wait for the process to end and reap it; its exit status."""
        if self._popen.returncode is None:
            if self._exited is None:
                self._exited = asyncio.ensure_future(_ended(self.pid))
            await asyncio.shield(self._exited)
            self._popen.wait()  # it has ended: reaping does not block
        returncode = self.returncode
        assert returncode is not None
        return returncode


def _read_report(fd: int) -> bytes:
    """What the pipe holds once every writer is gone (its reader is non-blocking: a writer the
    job kept alive cannot make the worker wait)."""
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def reported_status(report: bytes, returncode: int) -> int:
    """A sealed command's exit status, from the wait status its room's pid 1 reported (`report`,
    digits and a newline), else from bwrap's `returncode`: bwrap reports a death by signal N as
    128 + N, and with no report pid 1 itself was killed (by a signal, then)."""
    text = report.decode("ascii", errors="replace")
    if text.endswith("\n") and text[:-1].isdigit() and int(text[:-1]) < 65536:
        status = int(text[:-1])
        return -(status & 0x7F) if status & 0x7F else status >> 8
    if 128 < returncode < 128 + 65:
        return 128 - returncode
    return returncode


async def _ended(pid: int) -> None:
    """Once process `pid`, our child, has ended (pidfd; a thread where there is none)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # reaped already
        return
    except OSError:  # no pidfd (an old kernel): wait in a thread
        await asyncio.to_thread(os.waitid, os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        return
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _reader(loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader


@dataclass
class Running:
    """A started command: its process, identity and cgroup (if any), and the write end of
    its gate until the gate is opened or closed."""

    process: Child
    pid: int
    create_time: float
    cgroup: Path | None = None
    exited_at: float | None = None  # epoch seconds, once the exit was seen
    gate: int | None = None
    #: The v1 cgroups of its limits, joined with `cgroup` (`shared.host.cgroups`).
    limiters: tuple[Path, ...] = ()

    def open_gate(self) -> None:
        """Let the script run (once the task is durably `on_cpu` under our claim)."""
        if self.gate is not None:
            with contextlib.suppress(OSError):  # it was killed meanwhile
                os.write(self.gate, b"go\n")
            self.close_gate()

    async def join_cgroup(self) -> None:
        """Move the waiting process into its cgroup: at once where moves are quick (cgroup v2
        mounted with `favordynmods`: 0.1 ms), else off the event loop (a move then waits for an
        RCU grace period, 5-20 ms). If that fails, the command runs without one (as when the
        cgroup could not be made): process groups still reach its tree."""
        if self.cgroup is None:
            return
        if cgroups.moves_are_quick():
            joined = cgroups.join(self.cgroup, self.pid, self.limiters)
        else:
            joined = await asyncio.to_thread(cgroups.join, self.cgroup, self.pid, self.limiters)
        if not joined:
            self.cgroup = None

    def close_gate(self) -> None:
        """Never let the script run: the process ends at once if it still waits."""
        if self.gate is not None:
            os.close(self.gate)
            self.gate = None

    @property
    def returncode(self) -> int | None:
        """Its exit status once reaped (negative: the signal that killed it)."""
        return self.process.returncode

    def stop(self) -> None:
        """Never let the script run, and kill whatever was started (its tree, its cgroup)."""
        self.close_gate()
        signal_tree(self.pid, self.create_time, self.cgroup, signal.SIGKILL)

    async def reaped(self) -> int:
        """Wait for its process to end (after `stop`, say), and reap it; its exit status."""
        return await self.process.wait()

    def watch(self, sink: LineSink, on_exit: ExitNote) -> Coroutine[Any, Any, int]:
        """Feed its output to `sink` until it exits (its gate opened): `wait`."""
        return wait(self, sink, on_exit)


async def spawn(
    script: str,
    workdir: Path,
    env: dict[str, str],
    cgroup: Path | None = None,
    *,
    sealed: Callable[[int], Sequence[str]] | None = None,
    limiters: Sequence[Path] = (),
    prepare: Callable[[], None] | None = None,
) -> Running:
    """Start `bash -c script` in `workdir`, leading its own session and process group, held
    at a gate: the script does not start before `Running.open_gate()`, so a task whose claim
    was lost meanwhile (`on_cpu` refused) never runs it. With `cgroup`, call
    `Running.join_cgroup()` before opening the gate (it joins `limiters` too: the v1 cgroups
    holding its limits).

    No code runs in the child between fork and exec (so the fork is a cheap vfork, and it is
    made in a thread: the loop goes on while the kernel waits for the child's exec); the
    process joins its cgroup afterwards, from the worker, while it waits at the gate, where it
    cannot fork. The script is one argument to bash: user text is
    never interpolated into another shell line. `sealed` gives what bash is started through,
    given the number of the pipe its wait status is reported to
    (`services/worker/confinement.py`: its own gate, then its room); bash then waits at no gate
    of its own (`BASH_ENV` would name a file of the host's /tmp, which the room hides).
    `prepare` runs first, in the same thread (the work dir given to the job's uid): one
    hand-off to a thread, not two; if it raises, nothing is started.
    """
    loop = asyncio.get_running_loop()
    gate_read, gate_write = os.pipe()
    report_read, report_write = os.pipe() if sealed is not None else (None, None)
    environment = {**_inherited(), **env}
    argv = ["bash", "-c", script]
    if sealed is None:
        environment["BASH_ENV"] = str(_gate_file())
    else:
        assert report_write is not None
        argv = [*sealed(report_write), *argv]
    try:
        popen = await asyncio.to_thread(
            _popen, argv, workdir, environment, gate_read, prepare, report_write
        )
        assert popen.stdout is not None and popen.stderr is not None
        child = Child(popen, await _reader(loop, popen.stdout), await _reader(loop, popen.stderr))
    except BaseException:  # (cancelled, say): a process started meanwhile ends at its gate
        os.close(gate_write)
        if report_read is not None:
            os.close(report_read)
        raise
    if report_read is not None:
        os.set_blocking(report_read, False)
        child.report = report_read
    created = create_time(child.pid) or 0.0
    return Running(child, child.pid, created, cgroup, gate=gate_write, limiters=tuple(limiters))


def _popen(
    argv: list[str],
    workdir: Path,
    env: dict[str, str],
    gate_read: int,
    prepare: Callable[[], None] | None,
    report_write: int | None = None,
) -> "subprocess.Popen[bytes]":
    """(In a thread.) `prepare()`, then start `argv` in a session of its own, its stdin the
    gate's read end, with the report pipe's write end (if any); both are closed here once the
    child has them (never while another thread may pass them on)."""
    try:
        if prepare is not None:
            prepare()
        return subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=gate_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=() if report_write is None else (report_write,),
        )
    finally:
        os.close(gate_read)
        if report_write is not None:
            os.close(report_write)


@functools.cache
def _inherited() -> dict[str, str]:
    """This process's environment without what a command must not see (read once)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_HIDDEN_PREFIXES)}


async def _pump(
    stream: asyncio.StreamReader, name: Literal["stdout", "stderr"], sink: LineSink
) -> None:
    partial = b""
    while chunk := await stream.read(_CHUNK):
        partial += chunk
        *lines, partial = partial.split(b"\n")
        for line in lines:
            sink(name, line.decode("utf-8", errors="replace"))
        # A read of buffered data does not suspend: without this, a command printing faster
        # than we parse starves the event loop (heartbeats included) for as long as it prints.
        await asyncio.sleep(0)
    if partial:
        sink(name, partial.decode("utf-8", errors="replace"))


async def wait(running: Running, sink: LineSink, on_exit: ExitNote) -> int:
    """Feed every output line to `sink` and return the exit status (negative: killed by signal).

    `on_exit` is told the status as soon as the process ends, before the output is drained.
    When the command's main process ends, whatever it left behind in its process group and
    cgroup is killed, so that a stray background child cannot keep the pipes (and the task)
    open. The exit is seen by pidfd (`Child.wait`), not by the pipes' end, which a surviving
    child would delay.
    """
    proc = running.process
    pumps = asyncio.gather(_pump(proc.stdout, "stdout", sink), _pump(proc.stderr, "stderr", sink))
    try:
        returncode = await proc.wait()
        running.exited_at = time.time()
        await on_exit(returncode)
        signal_tree(running.pid, running.create_time, running.cgroup, signal.SIGKILL)
        await pumps
    except asyncio.CancelledError:
        signal_tree(running.pid, running.create_time, running.cgroup, signal.SIGKILL)
        pumps.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumps
        raise
    return returncode
