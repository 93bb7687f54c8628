"""`confinement.decide`: a worker that cannot confine says so (auto) or refuses to start (on)."""

import pytest

from services.worker import confinement
from services.worker.confinement import CannotConfine, Confinement


def test_the_command_goes_through_one_unshare_as_the_owners_uid() -> None:
    argv = Confinement(2_000_000).argv(7, "none")

    assert argv == ["unshare", "--net", "--setgid=2000007", "--setuid=2000007", "--"]
    assert "--net" not in Confinement(2_000_000).argv(7, "host")
    assert "--setuid=2000007" in Confinement(2_000_000).argv(7, "host")


def test_without_the_tools__auto_runs_unconfined_and_on_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shutil.which", lambda _tool: None)
    monkeypatch.setattr("os.geteuid", lambda: 0)

    assert confinement.decide("auto", 2_000_000) is None
    with pytest.raises(CannotConfine, match="unshare not found"):
        confinement.decide("on", 2_000_000)
    assert confinement.decide("off", 2_000_000) is None
