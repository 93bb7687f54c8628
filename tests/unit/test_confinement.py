"""`confinement.decide`: a worker that cannot confine says so (auto) or refuses to start (on);
the command passes its gate, enters its owner's network (through BusyBox's `nsenter` where
there is a `busybox`), then its room (bwrap), whose pid 1 takes the owner's uid and reports
the command's wait status."""

import os
from pathlib import Path

import pytest

from services.worker import confinement
from services.worker.confinement import CannotConfine, Confinement, Room
from services.worker.process import reported_status

ROOM = Room(Path("/srv/work"), Path("/srv/work/j-1/t-1"))


def test_the_command_passes_its_gate_enters_its_owners_network_then_its_room() -> None:
    held = Confinement(2_000_000, {7: 42})  # owner 7's namespace: the worker's file 42

    argv = held.argv(7, "none", ROOM, report=9)

    assert argv[:4] == ["sh", "-c", confinement.GATE, "vigil-gate"]
    assert argv[4:7] == ["nsenter", f"--net=/proc/{os.getpid()}/fd/42", "--"]
    assert argv[7 : argv.index("--", 7) + 1] == confinement.room_argv(ROOM)
    assert argv[-9:] == confinement.init_argv(2_000_007, 9, ROOM.workdir)[-9:]


def test_with_a_busybox_the_command_enters_through_its_nsenter_and_host_skips_it() -> None:
    held = Confinement(2_000_000, {7: 42}, busybox="/bin/busybox")

    argv = held.argv(7, "none", ROOM, report=9)
    host = held.argv(7, "host", ROOM, report=9)

    assert argv[4:8] == ["/bin/busybox", "nsenter", f"--net=/proc/{os.getpid()}/fd/42", "--"]
    assert host[4] == "bwrap" and "nsenter" not in host


def test_the_room_shows_the_host_read_only_hides_its_sockets_and_binds_the_work_dir() -> None:
    room = Room(
        Path("/srv/work"),
        Path("/srv/work/j-1/t-1"),
        hidden=(*confinement.HIDDEN, "/var/lib/mysql"),
        covered=("/srv/api.sock",),
        read_only=(Path("/data/genomes"),),
        scratch=(Path("/scratch"),),
        tmp_bytes=1024,
    )

    argv = confinement.room_argv(room)

    assert argv[:8] == ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    mounts = " ".join(argv)
    for private in ("/tmp", "/var/tmp", "/dev/shm"):
        assert f"--perms 1777 --size 1024 --tmpfs {private} " in mounts
    for hidden in ("/run", "/root", "/home", "/var/lib/mysql"):
        assert f"--tmpfs {hidden} " in mounts
    assert "--ro-bind /dev/null /srv/api.sock" in mounts
    # the work root empty, then the job's files read-only and the task's dir at their paths
    assert (
        "--perms 0711 --tmpfs /srv/work --perms 0711 --dir /srv/work/j-1"
        " --ro-bind-try /srv/work/j-1/.files /srv/work/j-1/.files"
        " --bind /srv/work/j-1/t-1 /srv/work/j-1/t-1"
        " --ro-bind-try /data/genomes /data/genomes --bind-try /scratch /scratch"
    ) in mounts
    assert argv[-4:] == ["--unshare-pid", "--unshare-ipc", "--as-pid-1", "--"]


def test_a_sockets_dir_is_hidden_unless_the_room_needs_it() -> None:
    room = Room(Path("/srv/work"), Path("/srv/work/j/t"), scratch=(Path("/var/lib/x/scratch"),))
    sockets = [
        "/run/postgresql/.s.PGSQL.5432",  # hidden already (/run)
        "/tmp/.X11-unix/X0",  # private already
        "/srv/work/j/t/mine.sock",  # the work root: only the task's own dir is seen
        "/var/lib/mysql/mysqld.sock",
        "/var/lib/mysql/sub/other.sock",  # under a dir hidden anyway
        "/srv/api.sock",  # /srv holds the work root: the socket alone is covered
        "/var/lib/x/control.sock",  # /var/lib/x holds a scratch path
        "/api.sock",  # / is kept
        "relative.sock",
    ]

    hidden, covered = confinement.hidden_for(sockets, room)

    assert hidden == ("/var/lib/mysql",)
    assert covered == ("/api.sock", "/srv/api.sock", "/var/lib/x/control.sock")


def test_the_hosts_sockets_are_read_from_proc_net_unix() -> None:
    listing = (
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 20 /run/postgresql/.s.PGSQL.5432\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 21 @/tmp/.X11-unix/X0\n"
        "0000000000000000: 00000003 00000000 00000000 0001 03 22\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 23 /srv/a b.sock\n"
    )

    assert confinement.host_sockets(listing) == ["/run/postgresql/.s.PGSQL.5432", "/srv/a b.sock"]


def test_the_reported_wait_status_wins_over_bwraps_exit_code() -> None:
    assert reported_status(b"768\n", 3) == 3  # exit 3
    assert reported_status(b"35584\n", 139) == 139  # exit 139, not SIGSEGV
    assert reported_status(b"11\n", 139) == -11  # SIGSEGV
    assert reported_status(b"", 137) == -9  # pid 1 itself killed: no report
    assert reported_status(b"", 125) == 125  # closed at its gate
    assert reported_status(b"", -9) == -9  # bwrap killed with its group
    assert reported_status(b"forged", 3) == 3


def test_a_worker_that_is_not_root_tries_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(confinement, "_tried", lambda _held: pytest.fail("nothing is tried"))

    assert confinement.decide("auto", 2_000_000) is None
    with pytest.raises(CannotConfine, match="not root"):
        confinement.decide("on", 2_000_000)


def test_a_root_worker_without_the_tools_refuses_to_start_unless_told_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`auto` never runs jobs as root: only `off` says so on purpose."""
    monkeypatch.setattr("shutil.which", lambda _tool: None)
    monkeypatch.setattr("os.geteuid", lambda: 0)

    with pytest.raises(CannotConfine, match=r"root and cannot seal .*bwrap and perl not found"):
        confinement.decide("auto", 2_000_000)
    with pytest.raises(CannotConfine, match="sh and nsenter and bwrap and perl not found"):
        confinement.decide("on", 2_000_000)
    assert confinement.decide("off", 2_000_000) is None


def test_a_busybox_that_cannot_confine_leaves_it_to_util_linux(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[tuple[str | None, str | None]] = []

    def trial(held: Confinement) -> str | None:
        tried.append((held.busybox, held.init))
        return "no nsenter applet" if held.busybox else None

    monkeypatch.setattr("shutil.which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(confinement, "compiled_init", lambda: "/var/vigil-init")
    monkeypatch.setattr(confinement, "_why_not_here", lambda: None)
    monkeypatch.setattr(confinement, "_tried", trial)

    held = confinement.decide("on", 2_000_000)

    busybox = "/usr/bin/busybox"
    assert tried == [(busybox, "/var/vigil-init"), (busybox, None), (None, "/var/vigil-init")]
    assert held is not None and held.busybox is None and held.init == "/var/vigil-init"


def test_a_compiled_pid_1_is_bound_into_the_room_and_run_in_perls_place() -> None:
    held = Confinement(2_000_000, {7: 42}, init="/var/vigil-init")
    room = held.room(ROOM.work_root, ROOM.workdir)

    argv = held.argv(7, "none", room, report=9)
    host = held.argv(7, "host", room, report=9)

    # it is the gate too, entering the owner's network itself: no sh, no nsenter
    assert argv[:3] == ["/var/vigil-init", "gate", f"/proc/{os.getpid()}/fd/42"]
    assert host[:3] == ["/var/vigil-init", "gate", "-"] and host[3:] == argv[3:]
    assert argv[3 : argv.index("--") + 1] == confinement.room_argv(room)
    assert " ".join(argv).count(f"--ro-bind /var/vigil-init {confinement.ROOM_INIT} ") == 1
    assert not {"sh", "nsenter", "perl"} & set(argv)
    tail = [confinement.ROOM_INIT, "2000007", "2000007", "9", str(ROOM.workdir)]
    assert argv[argv.index("--") + 1 :] == tail


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
