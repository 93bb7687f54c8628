"""Who a job runs as, and what it can reach: each command in a sealed room of its own.

A worker running as root starts each command through one chain of execs and forks, each with
one task:

1. `sh`, the gate: it waits for a line on stdin (the worker writes it once the command is in its
   cgroup and its task durably `on_cpu`; EOF: never run), ignores SIGTERM, SIGINT, SIGHUP and
   SIGQUIT (below), and execs the rest with /dev/null as stdin. Nothing forks before it: the
   worker moves this one process into the command's cgroup while it waits, and everything the
   command ever starts is made there.
2. `nsenter --net`: the network namespace of the job's owner on this worker, with not even a
   loopback up (no PostgreSQL, RabbitMQ, Redis or anything else), unless the job's policy says
   `network: host` (then this step is left out). BusyBox's where there is a `busybox` (one
   static binary, 0.5 ms of CPU a command less than util-linux's).
   An owner's namespace is made once, the first time one of their jobs runs here, and held
   by the worker (an open file of it); jobs of one owner share it, as they share a uid.
   Where the room's pid 1 is compiled (step 4), steps 1 and 2 are that program too, one exec
   instead of two (`vigil-init gate`, `INIT_C`): the same gate, then it enters the namespace.
3. `bwrap` (Debian's bubblewrap), as root, with no user namespace: a new mount, PID and IPC
   namespace (`room_argv`): the host's file system read-only; empty over `/run` (so
   `/var/run`), the homes (`/root`, `/home`) and every other directory holding a Unix socket of
   the host (`/proc/net/unix`, read at each start); a private `/tmp`, `/var/tmp` and `/dev/shm`
   of `VIGIL_JOB_TMP_MB` each (tmpfs: gone with the command, its pages charged to the
   command's cgroup); of the work root only the task's work dir (read-write) and its job's
   files (`<work root>/<job>/.files`, read-only), at their own absolute paths; a `/proc` of the
   command's own processes; the operator's `VIGIL_JOB_READ_ONLY_PATHS` and
   `VIGIL_JOB_SCRATCH_PATHS`.
4. `vigil-init`, the room's pid 1: a small C program (`INIT_C`) the worker compiles at its
   start with the host's `cc` (`compiled_init`; bound read-only at `/run/vigil-init` in each
   room); where there is no C compiler, the same program in perl (`INIT`, perl-base, in every
   Debian), whose start costs about 3 ms of CPU more a command. It takes the job's ids
   (`VIGIL_JOB_UID_BASE` + the owner's `users.job_uid`, its gid the same, no supplementary
   group, every capability lost with root), enters the work dir, forks `bash -c script` (umask
   077, default dispositions back) and reaps whatever is orphaned until bash ends. bwrap can
   only report a death by signal N as the exit code 128 + N; pid 1 writes bash's own wait
   status to a pipe of the worker's (`report`), so `exit 137` and a SIGKILL stay apart. As the
   init of its PID namespace it takes no signal it has no handler for, from outside or in; when
   it ends, the kernel kills everything left in the room.

The worker records the pid of step 1 (the same process through steps 2 and 3: each execs the
next): its process group holds pid 1 and the command, so killing it kills the room. The outer
bwrap ignores SIGTERM (step 1) so that a TERM of the group reaches the command and leaves it
its grace; a SIGKILL ends bwrap and pid 1, and with pid 1 every process of the room, in or out
of the group. No new privileges: the worker sets `no_new_privs` on itself once, when it decides
to confine, and every process it starts inherits it (it can never be unset), so a job cannot
gain any through a setuid program. The task's work dir is given to the job's uid (mode 0700)
before the command starts; the dirs above it stay root's, only traversable (0711). Numeric ids
need no account on the host.

The worker tries the very chain at its start (`_tried`: the ids and the PID namespace a command
gets). A worker that is not root cannot confine: with `VIGIL_JOB_ISOLATION=auto` (the default)
it then runs jobs as itself and says so at start; `on` makes that an error, `off` never
confines. A root worker that cannot seal (no bwrap, or its trial fails) never confines weaker
and never runs jobs as root by default: `on` and `auto` both refuse to start, naming what is
missing; only `off` runs every job as the worker's own user.
"""

import atexit
import ctypes
import dataclasses
import functools
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from shared.domain.bundle import HOST_DIR
from shared.host import work_root as work_root_of_host

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "on", "off"]
Network = Literal["none", "host"]

#: The tools a sealed command starts through (`nsenter`: util-linux's where there is no BusyBox).
TOOLS: Final = ("sh", "nsenter", "bwrap", "perl")
#: Where the BusyBox applet is looked for (`PATH`).
BUSYBOX: Final = "busybox"
#: prctl(2) option: no execve of this process or its descendants grants privileges.
_PR_SET_NO_NEW_PRIVS: Final = 38
#: unshare(2) flag: a new network namespace.
_CLONE_NEWNET: Final = 0x40000000

#: Step 1, the gate (`sh -c GATE vigil-gate argv...`): see the module's docstring.
GATE: Final = 'trap "" TERM INT HUP QUIT; IFS= read -r _ || exit 125; exec "$@" </dev/null'
#: Step 4, the room's pid 1 (`perl -e INIT uid gid report dir setgroups setresgid setresuid
#: prctl argv...`). Its ids are set by syscall: perl's `$<`, `$>` leave the saved uid root's,
#: and `$)` cannot empty the groups. It makes itself not dumpable (PR_SET_DUMPABLE 0): the job,
#: of the same uid, can neither trace it nor open its files in /proc (its report pipe).
INIT: Final = """\
my ($uid, $gid, $fd, $dir, $setgroups, $setresgid, $setresuid, $prctl) = splice @ARGV, 0, 8;
$0 = "vigil-init";
open my $report, ">&=", $fd or die "vigil: status pipe $fd: $!\\n";
syscall($setgroups + 0, 0, 0) == 0
  && syscall($setresgid + 0, $gid + 0, $gid + 0, $gid + 0) == 0
  && syscall($setresuid + 0, $uid + 0, $uid + 0, $uid + 0) == 0
  && syscall($prctl + 0, 4, 0) == 0
  or die "vigil: cannot take uid $uid: $!\\n";
chdir $dir or die "vigil: cannot enter $dir: $!\\n";
my $pid = fork // die "vigil: fork: $!\\n";
if (!$pid) {
  close $report; umask 077; $SIG{$_} = "DEFAULT" for qw(TERM INT HUP QUIT);
  exec { $ARGV[0] } @ARGV or do { warn "vigil: cannot run $ARGV[0]: $!\\n"; exit 127 };
}
while ((my $dead = wait) > 0) {
  next if $dead != $pid;
  syswrite $report, "$?\\n";
  exit($? & 127 ? 128 + ($? & 127) : $? >> 8);
}
exit 255;
"""
#: Step 4 in C, what `INIT` does (`vigil-init uid gid report dir argv...`), without perl's start;
#: and steps 1 and 2 in one process (`vigil-init gate NET argv...`): what `GATE` does, then it
#: enters the network namespace at path NET itself ("-": none), without `sh` and `nsenter`.
INIT_C: Final = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what, const char *name) {
  int error = errno;
  fprintf(stderr, "vigil: %s %s: %s\n", what, name, strerror(error));
  exit(error > 0 && error < 256 ? error : 255);
}

/* Steps 1 and 2 in one (`vigil-init gate NET command...`): the gate, then the network
   namespace whose path is NET ("-": the host's, left as it is). */
static int gate(char **argv) {
  int ignored[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  for (unsigned i = 0; i < sizeof ignored / sizeof *ignored; i++) signal(ignored[i], SIG_IGN);
  for (;;) {
    char c;
    ssize_t n = read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 125;
    if (c == '\n') break;
  }
  if (strcmp(argv[0], "-") != 0) {
    int net = open(argv[0], O_RDONLY | O_CLOEXEC);
    if (net < 0 || setns(net, CLONE_NEWNET) != 0) die("cannot enter the network", argv[0]);
    close(net);
  }
  int null = open("/dev/null", O_RDONLY);
  if (null < 0 || dup2(null, 0) != 0) die("cannot open", "/dev/null");
  if (null != 0) close(null);
  execvp(argv[1], argv + 1);
  fprintf(stderr, "vigil: cannot run %s: %s\n", argv[1], strerror(errno));
  return 127;
}

int main(int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "gate") == 0) return gate(argv + 2);
  if (argc < 6) {
    fputs("vigil: usage: vigil-init uid gid report dir command...\n", stderr);
    return 255;
  }
  uid_t uid = (uid_t)strtoul(argv[1], NULL, 10);
  gid_t gid = (gid_t)strtoul(argv[2], NULL, 10);
  int report = atoi(argv[3]);
  if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0
      || setresuid(uid, uid, uid) != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
    die("cannot take uid", argv[1]);
  if (chdir(argv[4]) != 0) die("cannot enter", argv[4]);
  pid_t pid = fork();
  if (pid < 0) die("fork", "");
  if (pid == 0) {
    int reset[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    close(report);
    umask(077);
    for (unsigned i = 0; i < sizeof reset / sizeof *reset; i++) signal(reset[i], SIG_DFL);
    execvp(argv[5], argv + 5);
    fprintf(stderr, "vigil: cannot run %s: %s\n", argv[5], strerror(errno));
    _exit(127);
  }
  for (;;) {
    int status;
    pid_t dead = wait(&status);
    if (dead < 0) {
      if (errno == EINTR) continue;
      return 255;
    }
    if (dead != pid) continue;
    dprintf(report, "%d\n", status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }
}
"""
#: Where a room has the compiled pid 1 (`compiled_init`), bound read-only over its empty `/run`.
ROOM_INIT: Final = "/run/vigil-init"
#: The numbers of setgroups(2), setresgid(2), setresuid(2) and prctl(2), by machine (no other
#: is sealed).
_ID_SYSCALLS: Final = {
    "x86_64": (116, 119, 117, 157),
    "aarch64": (159, 149, 147, 167),
    "riscv64": (159, 149, 147, 167),
}
#: What every room has its own of, empty and writable by all (1777), `VIGIL_JOB_TMP_MB` each.
PRIVATE: Final = ("/tmp", "/var/tmp", "/dev/shm")
#: What every room has empty (root's, 0755): the host's run-time dir and the homes.
HIDDEN: Final = ("/run", "/root", "/home")
#: Directories never hidden for a socket in them (the room needs them); such a socket alone is
#: covered (`/dev/null` bound over it).
_KEPT: Final = frozenset(
    (
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/opt",
        "/proc",
        "/sbin",
        "/srv",
        "/sys",
        "/usr",
        "/var",
    )
)


class CannotConfine(Exception):
    """Isolation was asked for and this worker cannot give it."""


@dataclass(frozen=True)
class Room:
    """What a command's room holds beside the host's read-only file system (`room_argv`)."""

    work_root: Path
    #: The task's work dir, `<work root>/<job>/<task>`: the only place it may write (with its
    #: private temporary dirs and `scratch`).
    workdir: Path
    #: Empty (root's) over each: `HIDDEN`, and the dirs of the host's sockets (`hidden_for`).
    hidden: tuple[str, ...] = HIDDEN
    #: Sockets whose dir the room needs: `/dev/null` over each.
    covered: tuple[str, ...] = ()
    read_only: tuple[Path, ...] = ()
    scratch: tuple[Path, ...] = ()
    #: The size of each private temporary dir (`PRIVATE`).
    tmp_bytes: int = 512 * 1024 * 1024
    #: The compiled pid 1 (`compiled_init`), bound at `ROOM_INIT` (None: perl's `INIT`).
    init: str | None = None


def room_argv(room: Room) -> list[str]:
    """`bwrap` and its options, sealing a command into `room` (mounts in this order: each over
    what came before)."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for private in PRIVATE:
        argv += ["--perms", "1777", "--size", str(room.tmp_bytes), "--tmpfs", private]
    for hidden in room.hidden:
        argv += ["--tmpfs", hidden]
    for socket in room.covered:
        argv += ["--ro-bind", "/dev/null", socket]
    if room.init is not None:
        argv += ["--ro-bind", room.init, ROOM_INIT]
    job_dir = room.workdir.parent
    argv += ["--perms", "0711", "--tmpfs", str(room.work_root)]
    argv += ["--perms", "0711", "--dir", str(job_dir)]
    argv += ["--ro-bind-try", *[str(job_dir / HOST_DIR)] * 2, "--bind", *[str(room.workdir)] * 2]
    for path in room.read_only:
        argv += ["--ro-bind-try", str(path), str(path)]
    for path in room.scratch:
        argv += ["--bind-try", str(path), str(path)]
    return [*argv, "--unshare-pid", "--unshare-ipc", "--as-pid-1", "--"]


def hidden_for(sockets: Iterable[str], room: Room) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the dirs to hide, the sockets to cover) for the host's bound Unix `sockets` (absolute
    paths), beside `HIDDEN`: a socket already out of sight (under a hidden or private dir, or
    the work root, where only the task's own dir is seen) needs nothing; a socket in a dir the
    room needs (`_KEPT`, or one holding the work root or an operator's path) is covered alone."""
    gone = (*HIDDEN, *PRIVATE, str(room.work_root))
    needed = [str(p) for p in (room.work_root, *room.read_only, *room.scratch)]
    hidden: set[str] = set()
    covered: set[str] = set()
    for socket in sockets:
        if not socket.startswith("/") or _under(socket, gone):
            continue
        directory = os.path.dirname(socket)
        if directory in _KEPT or any(_under(path, (directory,)) for path in needed):
            covered.add(socket)
        else:
            hidden.add(directory)
    outermost = {d for d in hidden if not _under(d, [h for h in hidden if h != d])}
    return tuple(sorted(outermost)), tuple(sorted(s for s in covered if not _under(s, outermost)))


def _under(path: str, dirs: Iterable[str]) -> bool:
    """Whether `path` is one of `dirs` or below one."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def host_sockets(listing: str) -> list[str]:
    """The paths of the bound Unix sockets in `/proc/net/unix` text (abstract ones, `@...`,
    are left to the network namespace)."""
    paths = []
    for line in listing.splitlines()[1:]:
        fields = line.split(maxsplit=7)
        if len(fields) == 8 and fields[7].startswith("/"):
            paths.append(fields[7])
    return paths


def _read_sockets() -> list[str]:
    """The host's bound Unix sockets now (this process's network namespace: the host's), by
    the paths their dirs resolve to (a socket bound through `/var/run` is in `/run`); those
    whose dir is gone are left out."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as listing:
            bound = host_sockets(listing.read())
    except OSError:
        return []
    resolved = set()
    for path in bound:
        directory = os.path.realpath(os.path.dirname(path))
        if os.path.isdir(directory):
            resolved.add(os.path.join(directory, os.path.basename(path)))
    return sorted(resolved)


def init_argv(uid: int, report: int, workdir: Path, compiled: bool = False) -> list[str]:
    """The room's pid 1 and its arguments: the compiled one at `ROOM_INIT` (`INIT_C`), else
    `perl` (`INIT`); `report` is the number of the pipe's write end it writes the command's
    wait status to."""
    ids = [str(uid), str(uid), str(report), str(workdir)]
    if compiled:
        return [ROOM_INIT, *ids]
    numbers = _ID_SYSCALLS.get(platform.machine(), (-1, -1, -1, -1))
    return ["perl", "-e", INIT, *ids, *map(str, numbers)]


@functools.cache
def compiled_init() -> str | None:
    """The path of `INIT_C` compiled with the host's `cc` (once per process, into a directory
    of root's alone, removed at exit); None where there is no `cc` or it fails (pid 1 is then
    perl's)."""
    compiler = shutil.which("cc")
    if compiler is None:
        return None
    directory = tempfile.mkdtemp(prefix="vigil-init-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = os.path.join(directory, "vigil-init")
    try:
        made = subprocess.run(
            [compiler, "-O2", "-x", "c", "-o", path, "-"],
            input=INIT_C.encode(),
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("the room's pid 1 is perl's: %s cannot compile it (%s)", compiler, exc)
        return None
    if made.returncode != 0:
        error = made.stderr.decode(errors="replace").strip()
        logger.warning("the room's pid 1 is perl's: %s cannot compile it (%s)", compiler, error)
        return None
    return path


@dataclass(frozen=True)
class Confinement:
    """How this worker confines its jobs: the uid of owner `n` is `uid_base + n`."""

    uid_base: int
    #: The network namespace of each owner's jobs (by `job_uid`): an open file of it.
    _networks: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    #: The `busybox` whose `nsenter` enters the namespace (None: util-linux's).
    busybox: str | None = None
    #: What a site adds to every room (`VIGIL_JOB_READ_ONLY_PATHS`, `VIGIL_JOB_SCRATCH_PATHS`).
    read_only: tuple[Path, ...] = ()
    scratch: tuple[Path, ...] = ()
    tmp_bytes: int = 512 * 1024 * 1024
    #: The room's pid 1 compiled (`compiled_init`; None: perl's `INIT`).
    init: str | None = None

    def uid_of(self, job_uid: int) -> int:
        return self.uid_base + job_uid

    def room(self, work_root: Path, workdir: Path, sockets: Iterable[str] = ()) -> Room:
        """The room of a command whose work dir is `workdir`, hiding the dirs of `sockets`."""
        room = Room(
            work_root, workdir, (), (), self.read_only, self.scratch, self.tmp_bytes, self.init
        )
        hidden, covered = hidden_for(sockets, room)
        return dataclasses.replace(room, hidden=(*HIDDEN, *hidden), covered=covered)

    def argv(self, job_uid: int, network: Network, room: Room, report: int) -> list[str]:
        """What goes before `bash -c script` for a job of the owner whose `job_uid` is given,
        sealed in `room`, its wait status written to file `report` (`OSError` if the owner's
        network namespace cannot be made)."""
        gate = ["sh", "-c", GATE, "vigil-gate"]
        compiled = room.init is not None
        uid = self.uid_of(job_uid)
        inner = [*room_argv(room), *init_argv(uid, report, room.workdir, compiled)]
        if room.init is not None:  # the compiled gate enters the namespace itself
            net = "-" if network == "host" else self.network_of(job_uid)
            return [room.init, "gate", net, *inner]
        if network == "host":
            return [*gate, *inner]
        net = f"--net={self.network_of(job_uid)}"
        if self.busybox is not None:
            return [*gate, self.busybox, "nsenter", net, "--", *inner]
        return [*gate, "nsenter", net, "--", *inner]

    def network_of(self, job_uid: int) -> str:
        """The path of the network namespace of this owner's jobs (made at the first call)."""
        held = self._networks.get(job_uid)
        if held is None:
            held = self._networks[job_uid] = _new_network()
        return f"/proc/{os.getpid()}/fd/{held}"

    def sealer(self, work_root: Path, workdir: Path, job_uid: int, network: Network) -> "Sealer":
        """What builds the command's argv once its report pipe is made (at its spawn); the
        owner's network namespace is made now if it must be (`OSError` if it cannot)."""
        if network == "none":
            self.network_of(job_uid)
        return Sealer(self, self.room(work_root, workdir, _read_sockets()), job_uid, network)

    def hand_over(self, work_root: Path, workdir: Path, job_uid: int) -> None:
        """Give the work dir (and what setup put in it) to the job's uid, mode 0700; the work
        root and the job's dir stay root's, traversable only. Links are not followed."""
        for directory in (work_root, workdir.parent):
            directory.chmod(0o711)
        uid = self.uid_of(job_uid)
        for parent, dirs, files in os.walk(workdir, followlinks=False):
            for name in dirs:
                os.chown(os.path.join(parent, name), uid, uid, follow_symlinks=False)
            for name in files:
                path = os.path.join(parent, name)
                if not _shared_file(os.lstat(path)):
                    os.chown(path, uid, uid, follow_symlinks=False)
        os.chown(workdir, uid, uid, follow_symlinks=False)
        workdir.chmod(0o700)


@dataclass(frozen=True)
class Sealer:
    """A command's seal, made ready: its argv, given the number of its report pipe."""

    confinement: Confinement
    room: Room
    job_uid: int
    network: Network

    def __call__(self, report: int) -> list[str]:
        return self.confinement.argv(self.job_uid, self.network, self.room, report)


def _shared_file(seen: os.stat_result) -> bool:
    """Whether a file of a work dir is root's and has other names: a recorded output frozen
    and placed in a chained task's dir (`shared/host/chained_inputs.py`), or whatever the job
    hard-linked there. It stays as it is: giving it to the job would let it change the other
    names' file."""
    return stat.S_ISREG(seen.st_mode) and seen.st_uid == 0 and seen.st_nlink > 1


def decide(
    isolation: Isolation, uid_base: int, sealed: Confinement | None = None
) -> Confinement | None:
    """The confinement this worker gives its jobs, or None (jobs run as the worker's user).
    `sealed` carries the site's paths and sizes (`uid_base` and no paths when None).
    `CannotConfine` when `on` was asked for and this worker is not root or cannot seal, and
    when it is root and cannot seal (`auto` never runs jobs as root)."""
    if isolation == "off":
        logger.warning("VIGIL_JOB_ISOLATION=off: jobs run as the worker's own user")
        return None
    base = sealed if sealed is not None else Confinement(uid_base)
    confinement = base
    why = _why_not_here()
    if why is None:  # after no_new_privs: it tries the very argv jobs get
        confinement, why = _cheapest_that_seals(base, shutil.which(BUSYBOX), compiled_init())
    if why is not None:
        if isolation == "on":
            raise CannotConfine(f"VIGIL_JOB_ISOLATION=on, but {why}")
        if os.geteuid() == 0:  # every job would run as root, unsealed: never by default
            raise CannotConfine(
                f"this worker is root and cannot seal jobs ({why}): install what is missing"
                " (scripts/up does: apt-get install bubblewrap), or set"
                " VIGIL_JOB_ISOLATION=off to run every job as root on purpose"
            )
        logger.warning("jobs run as the worker's own user, unconfined: %s", why)
        return None
    logger.info(
        "jobs run sealed: uid %d + their owner's number, a network namespace each (%s), a"
        " room of their own (bwrap, pid 1 %s)",
        uid_base,
        f"BusyBox's nsenter, {confinement.busybox}" if confinement.busybox else "util-linux's",
        "compiled" if confinement.init else "perl's",
    )
    return confinement


def _cheapest_that_seals(
    base: Confinement, busybox: str | None, init: str | None
) -> tuple[Confinement, str | None]:
    """The cheapest chain whose trial seals a command (BusyBox's nsenter before util-linux's,
    the compiled pid 1 before perl's), and None; else `base` and why the last one tried fails."""
    why: str | None = None
    for nsenter in dict.fromkeys((busybox, None)):
        for pid1 in dict.fromkeys((init, None)):
            chain = dataclasses.replace(base, busybox=nsenter, init=pid1)
            why = _tried(chain)
            if why is None:
                return chain, None
            logger.warning(
                "%s nsenter with pid 1 %s cannot confine jobs: %s",
                nsenter or "util-linux's",
                pid1 or "perl's",
                why,
            )
    return base, why


def check_reach(confinement: Confinement | None, work_root: Path) -> None:
    """`CannotConfine` when jobs are confined and could not reach their work dirs under
    `work_root` by their absolute paths (`shared/host/work_root.py`): their status files and
    chained inputs would be refused them. The work root is made here if missing."""
    if confinement is None:
        return
    work_root.mkdir(parents=True, exist_ok=True)
    why = work_root_of_host.unreachable(work_root)
    if why is not None:
        raise CannotConfine(why)


def _new_network() -> int:
    """A new network namespace, with nothing up, held by the file returned (open, not inherited
    by children). Made by a thread of its own, which ends with it (the namespace is a thread's,
    not the process's: no other thread of the worker ever enters it)."""
    made: list[int] = []
    failed: list[OSError] = []

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            failed.append(OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}"))
            return
        made.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))

    maker = threading.Thread(target=make, name="vigil-netns", daemon=True)
    maker.start()
    maker.join()
    if failed:
        raise failed[0]
    if not made:
        raise OSError("no network namespace was made (the thread making it failed)")
    return made[0]


def forbid_new_privileges() -> str | None:
    """Set `no_new_privs` on this process (inherited by all it starts, never unset): None, or
    why it could not be set. A root worker keeps its own privileges; the jobs it starts as
    another uid can gain none through a setuid or file-capability program."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    return None


def _why_not_here() -> str | None:
    """Why this worker cannot confine jobs whatever it starts them through (None: it may):
    it is not root, a tool is missing, its machine's id syscalls are not known here, or
    `no_new_privs` cannot be set (it is set here)."""
    if os.geteuid() != 0:
        return "the worker is not root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (apt-get install {_packages(missing)})"
    if platform.machine() not in _ID_SYSCALLS:
        return f"a command cannot be sealed on a {platform.machine()} machine (its id syscalls)"
    return forbid_new_privileges()


def _packages(tools: Sequence[str]) -> str:
    """The Debian packages holding `tools`."""
    named = {"bwrap": "bubblewrap", "nsenter": "util-linux", "sh": "dash", "perl": "perl-base"}
    return " ".join(named[tool] for tool in tools)


#: What the trial command checks beside its ids: bash, in a PID namespace of its own (pid 1 is
#: the room's), with no socket of the host's in sight and the host read-only.
_TRIAL: Final = """test -n "$BASH_VERSION" || exit 11
test "$$" = 2 || exit 12
test ! -e /run/postgresql || exit 13
! touch /etc/.vigil-trial 2>/dev/null || exit 14
exec cat /proc/self/status"""


def _tried(confinement: Confinement) -> str | None:
    """Why `confinement` cannot confine jobs (None: it can), from one command started the way
    jobs are, in a room of a work dir of its own (`bash -c`, which must be bash: a BusyBox built
    to run its own shell for `bash` would not do), whose ids and wait status are checked: a
    container without CAP_SYS_ADMIN, for one, may not make namespaces."""
    made = Path(tempfile.mkdtemp(prefix="vigil-trial-"))
    try:
        workdir = made / "job" / "task"
        workdir.mkdir(parents=True)
        confinement.hand_over(made, workdir, 0)
        room = confinement.room(made, workdir, _read_sockets())
        return _tried_in(confinement, room)
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _tried_in(confinement: Confinement, room: Room) -> str | None:
    report_read, report_write = os.pipe()
    try:
        argv = [*confinement.argv(0, "none", room, report_write), "bash", "-c", _TRIAL]
        tried = subprocess.run(
            argv,
            cwd="/",  # somewhere the job's uid may be (the worker's own dir may be closed)
            input=b"go\n",
            capture_output=True,
            timeout=10,
            check=False,
            pass_fds=(report_write,),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a sealed test command failed: {exc}"
    finally:
        os.close(report_write)
    with os.fdopen(report_read, "rb") as report:
        reported = report.read(64)
    if tried.returncode != 0 or reported != b"0\n":
        error = tried.stderr.decode(errors="replace").strip()
        return f"a sealed test command failed ({error or tried.returncode}, {reported!r})"
    return _wrong_ids(tried.stdout.decode(errors="replace"), confinement.uid_of(0))


def _wrong_ids(status: str, uid: int) -> str | None:
    """What is wrong with the ids of a process whose `/proc/<pid>/status` is `status`, meant to
    be `uid` (real, effective, saved and file system uid and gid) and in no other group; None
    when nothing is."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    seen = {name: fields.get(name, "").split() for name in ("Uid", "Gid", "Groups")}
    if seen == {"Uid": [str(uid)] * 4, "Gid": [str(uid)] * 4, "Groups": []}:
        return None
    return f"a confined test command ran as {seen}, not as uid and gid {uid} alone"
