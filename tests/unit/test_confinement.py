"""`confinement.decide`: a worker that cannot confine says so (auto) or refuses to start (on);
the command enters its owner's network as its owner's uid, through BusyBox's `nsenter` where
there is a `busybox`."""

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


def test_with_a_busybox_the_command_enters_through_its_nsenter() -> None:
    held = Confinement(2_000_000, {7: 42}, busybox="/bin/busybox")

    assert held.argv(7, "none") == [
        "/bin/busybox",
        "nsenter",
        f"--net=/proc/{os.getpid()}/fd/42",
        "-G2000007",
        "-S2000007",
        "--",
    ]
    assert held.argv(7, "host") == ["unshare", "--setgid=2000007", "--setuid=2000007", "--"]


def test_a_worker_that_is_not_root_tries_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(confinement, "_tried", lambda _held: pytest.fail("nothing is tried"))

    assert confinement.decide("auto", 2_000_000) is None
    with pytest.raises(CannotConfine, match="not root"):
        confinement.decide("on", 2_000_000)


def test_without_the_tools__auto_runs_unconfined_and_on_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shutil.which", lambda _tool: None)
    monkeypatch.setattr("os.geteuid", lambda: 0)

    assert confinement.decide("auto", 2_000_000) is None
    with pytest.raises(CannotConfine, match="nsenter and unshare not found"):
        confinement.decide("on", 2_000_000)
    assert confinement.decide("off", 2_000_000) is None


def test_a_busybox_that_cannot_confine_leaves_it_to_util_linux(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[str | None] = []

    def trial(held: Confinement) -> str | None:
        tried.append(held.busybox)
        return "no nsenter applet" if held.busybox else None

    monkeypatch.setattr("shutil.which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(confinement, "_why_not_here", lambda: None)
    monkeypatch.setattr(confinement, "_tried", trial)

    held = confinement.decide("on", 2_000_000)

    assert tried == ["/usr/bin/busybox", None]
    assert held is not None and held.busybox is None


def test_the_trial_command_must_run_as_the_jobs_uid_and_gid_alone() -> None:
    def status(uid: str, gid: str, groups: str) -> str:
        return f"Name:\tcat\nUid:\t{uid}\nGid:\t{gid}\nGroups:\t{groups}\nNoNewPrivs:\t1\n"

    job = "\t".join(["2000000"] * 4)

    assert confinement._wrong_ids(status(job, job, ""), 2_000_000) is None
    for wrong in (
        status(job, job, "0 27"),  # supplementary groups kept
        status("2000000\t0\t2000000\t2000000", job, ""),  # root's effective uid
        status(job, "0\t0\t0\t0", ""),  # root's gid
    ):
        found = confinement._wrong_ids(wrong, 2_000_000)
        assert found is not None and "not as uid and gid 2000000 alone" in found
