"""scripts/keeper, which scripts/up runs each service under: a service that dies is started
again, one that cannot start is not restarted for ever, and a stop reaches the service."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

KEEPER = Path(__file__).resolve().parents[2] / "scripts" / "keeper"
SERVICE = [sys.executable, "-c", "import time; time.sleep(60)"]


def _keeper(tmp_path: Path, command: list[str], min_up_s: int) -> subprocess.Popen[bytes]:
    env = os.environ | {"VIGIL_KEEPER_MIN_UP_S": str(min_up_s)}
    with (tmp_path / "svc.log").open("wb") as log:  # the keeper holds its own descriptor
        return subprocess.Popen(
            [str(KEEPER), str(tmp_path / "svc.pid"), *command],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _child(keeper: subprocess.Popen[bytes], other_than: int | None = None) -> psutil.Process:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = psutil.Process(keeper.pid).children()
        if children and children[0].pid != other_than:
            return children[0]
        time.sleep(0.02)
    raise AssertionError("the keeper started no service")


def test_a_service_that_dies_is_started_again_and_a_stop_reaches_it(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path, SERVICE, min_up_s=0)
    try:
        first = _child(keeper)
        assert (tmp_path / "svc.pid").read_text().strip() == str(keeper.pid)

        first.kill()  # as the OOM killer would
        second = _child(keeper, other_than=first.pid)
        assert second.pid != first.pid

        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(10) != 0  # the service's own answer to SIGTERM
        assert not second.is_running() or second.status() == psutil.STATUS_ZOMBIE
    finally:
        keeper.kill()
        keeper.wait()
    assert "starting it again" in (tmp_path / "svc.log").read_text()


def test_a_service_that_cannot_start_is_not_restarted_for_ever(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path, [sys.executable, "-c", "raise SystemExit(3)"], min_up_s=10)

    assert keeper.wait(10) == 3
    assert "not restarting" in (tmp_path / "svc.log").read_text()


def test_a_service_that_stops_cleanly_is_not_restarted(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path, [sys.executable, "-c", "pass"], min_up_s=0)

    assert keeper.wait(10) == 0
    assert "starting it again" not in (tmp_path / "svc.log").read_text()
