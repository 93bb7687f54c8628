"""scripts/keeper, which scripts/up runs each service under: a service that dies is started
again, one that cannot start is not restarted for ever, and a stop reaches the service.

The service here says what happens to it (`started <pid>`, `stopped <pid>`) on a pipe it
inherits through the keeper, and the test waits for those lines: no delay is guessed, so the
test holds on a loaded machine, and it knows it acts on the service, not a shell the keeper
forked on the way to it.
"""

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

KEEPER = Path(__file__).resolve().parents[2] / "scripts" / "keeper"
#: Longest wait for the keeper or its service: only ever reached when something is wrong.
WAIT_S = 60.0
#: A service that says so: `python SERVICE FD run|exit CODE`.
SERVICE = """
import os, signal, sys, time
fd, mode = int(sys.argv[1]), sys.argv[2]
def stop(*_):
    os.write(fd, b"stopped %d\\n" % os.getpid())
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
os.write(fd, b"started %d\\n" % os.getpid())
if mode == "exit":
    sys.exit(int(sys.argv[3]))
time.sleep(WAIT_S)
""".replace("WAIT_S", repr(WAIT_S))


class _Said:
    """The lines the services under one keeper write on their pipe."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""

    def next(self) -> str:
        """The next line; fails after `WAIT_S` or when nobody is left to write one."""
        deadline = time.monotonic() + WAIT_S
        while b"\n" not in self._buffer:
            if not self._read(deadline):
                raise AssertionError(f"the services are gone, having said only {self._buffer!r}")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def rest(self) -> list[str]:
        """Every line still to come, once every service has gone (the pipe is closed)."""
        deadline = time.monotonic() + WAIT_S
        while self._read(deadline):
            pass
        text, self._buffer = self._buffer.decode(), b""
        return text.splitlines()

    def _read(self, deadline: float) -> bool:
        """Read what is there (waiting until `deadline`); False when the pipe is closed."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"the services said nothing more within {WAIT_S} s")
        chunk = os.read(self._fd, 4096)
        self._buffer += chunk
        return bool(chunk)


@contextmanager
def _keeper(
    tmp_path: Path, *args: str, min_up_s: int
) -> Iterator[tuple[subprocess.Popen[bytes], _Said]]:
    """The keeper running SERVICE with `args`, and what its services say; killed at the end."""
    service = tmp_path / "service.py"
    service.write_text(SERVICE)
    ours, theirs = os.pipe()
    env = os.environ | {"VIGIL_KEEPER_MIN_UP_S": str(min_up_s)}
    command = [sys.executable, str(service), str(theirs), *args]
    try:
        with (tmp_path / "svc.log").open("wb") as log:  # the keeper holds its own descriptor
            keeper = subprocess.Popen(
                [str(KEEPER), str(tmp_path / "svc.pid"), *command],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs,),
            )
        os.close(theirs)  # only the keeper and its services hold it: it closes when they end
        theirs = -1
        try:
            yield keeper, _Said(ours)
        finally:
            keeper.kill()
            keeper.wait()
    finally:
        os.close(ours)
        if theirs >= 0:
            os.close(theirs)


def _pid(line: str, event: str) -> int:
    said, _, pid = line.partition(" ")
    assert said == event, line
    return int(pid)


def test_a_service_that_dies_is_started_again_and_a_stop_reaches_it(tmp_path: Path) -> None:
    with _keeper(tmp_path, "run", min_up_s=0) as (keeper, said):
        first = _pid(said.next(), "started")
        assert (tmp_path / "svc.pid").read_text().strip() == str(keeper.pid)

        os.kill(first, signal.SIGKILL)  # as the OOM killer would
        second = _pid(said.next(), "started")
        assert second != first

        keeper.send_signal(signal.SIGTERM)
        assert _pid(said.next(), "stopped") == second
        assert keeper.wait(WAIT_S) == 143  # the service's own answer to SIGTERM
        assert said.rest() == []
    assert "starting it again" in (tmp_path / "svc.log").read_text()


def test_a_service_that_cannot_start_is_not_restarted_for_ever(tmp_path: Path) -> None:
    # it exits 3 long before VIGIL_KEEPER_MIN_UP_S
    with _keeper(tmp_path, "exit", "3", min_up_s=int(WAIT_S)) as (keeper, said):
        assert keeper.wait(WAIT_S) == 3
        assert _started(said.rest()) == 1
    assert "not restarting" in (tmp_path / "svc.log").read_text()


def test_a_service_that_stops_cleanly_is_not_restarted(tmp_path: Path) -> None:
    with _keeper(tmp_path, "exit", "0", min_up_s=0) as (keeper, said):
        assert keeper.wait(WAIT_S) == 0
        assert _started(said.rest()) == 1
    assert "starting it again" not in (tmp_path / "svc.log").read_text()


def _started(lines: list[str]) -> int:
    """How many times the service started, all it said being `lines`."""
    return len([_pid(line, "started") for line in lines])
