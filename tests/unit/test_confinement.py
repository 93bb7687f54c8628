"""`confinement.decide`: a worker that cannot confine says so (auto) or refuses to start (on)."""

import os

import pytest

from services.worker import confinement
from services.worker.confinement import CannotConfine, Confinement


def test_the_command_enters_its_owners_network_as_the_owners_uid_through_one_exec() -> None:
    held = Confinement(2_000_000, {7: 42})  # owner 7's namespace: the worker's file 42

    assert held.argv(7, "none") == [
        "nsenter",
        f"--net=/proc/{os.getpid()}/fd/42",
        "--setgid=2000007",
        "--setuid=2000007",
        "--",
    ]
    assert held.argv(7, "host") == ["unshare", "--setgid=2000007", "--setuid=2000007", "--"]


def test_without_the_tools__auto_runs_unconfined_and_on_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shutil.which", lambda _tool: None)
    monkeypatch.setattr("os.geteuid", lambda: 0)

    assert confinement.decide("auto", 2_000_000) is None
    with pytest.raises(CannotConfine, match="nsenter and unshare not found"):
        confinement.decide("on", 2_000_000)
    assert confinement.decide("off", 2_000_000) is None
