"""Who a job runs as, and what it can reach (issue 17).

A worker running as root starts each command through one `nsenter`: `--net` (the network
namespace of the job's owner on this worker, with not even a loopback up: no PostgreSQL,
RabbitMQ, Redis or anything else, unless the job's policy says `network: host`), then the gid
and the uid (`VIGIL_JOB_UID_BASE` + the owner's `users.job_uid`; setting the gid drops the
supplementary groups). BusyBox's `nsenter` where there is a `busybox` (Debian's
busybox-static: one static binary, no dynamic loader to run; 0.5 ms of CPU a command less
than util-linux's, which loads libselinux and libpcre2: `docs/performance.md`, step 35), else
util-linux's; the worker tries the one it picks before it uses it, and checks the ids the
command gets.

An owner's namespace is made once, the first time one of their jobs runs here, and held by the
worker (an open file of it: it goes with the worker); each command enters it. Jobs of one
owner share it, as they share a uid; another owner's jobs are in another. Making and tearing
down a namespace per command cost about 0.6 ms of CPU a task, much of it in the kernel's
threads (`docs/performance.md`, step 32). A job whose policy says `network: host` starts
through util-linux's `unshare`, which sets the ids alone. No new privileges: the worker sets
`no_new_privs` on itself once, when it decides to confine, and every process it starts
inherits it (it can never be unset), so a job cannot gain any through a setuid program. One
exec before bash, not two (`setpriv` cost 1.5 ms of CPU a task). The task's work dir is given
to that uid (mode 0700) before the command starts; the dirs above it stay root's, only
traversable (0711). Numeric ids need no account on the host.

A worker that is not root cannot do this: with `VIGIL_JOB_ISOLATION=auto` (the default) it
then runs jobs as itself and says so at start; `on` makes that an error, `off` never confines.
"""

import ctypes
import logging
import os
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from shared.host import work_root as work_root_of_host

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "on", "off"]
Network = Literal["none", "host"]

#: The tools (util-linux) the confinement runs through where there is no BusyBox (`unshare`
#: for `network: host` in any case).
TOOLS: Final = ("nsenter", "unshare")
#: Where the BusyBox applet is looked for (`PATH`).
BUSYBOX: Final = "busybox"
#: prctl(2) option: no execve of this process or its descendants grants privileges.
_PR_SET_NO_NEW_PRIVS: Final = 38
#: unshare(2) flag: a new network namespace.
_CLONE_NEWNET: Final = 0x40000000


class CannotConfine(Exception):
    """Isolation was asked for and this worker cannot give it."""


@dataclass(frozen=True)
class Confinement:
    """How this worker confines its jobs: the uid of owner `n` is `uid_base + n`."""

    uid_base: int
    #: The network namespace of each owner's jobs (by `job_uid`): an open file of it.
    _networks: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    #: The `busybox` whose `nsenter` enters the namespace (None: util-linux's).
    busybox: str | None = None

    def uid_of(self, job_uid: int) -> int:
        return self.uid_base + job_uid

    def argv(self, job_uid: int, network: Network) -> list[str]:
        """What goes before `bash -c script` for a job of the owner whose `job_uid` is given
        (`OSError` if their network namespace cannot be made)."""
        uid = self.uid_of(job_uid)
        ids = [f"--setgid={uid}", f"--setuid={uid}"]
        if network == "host":
            return ["unshare", *ids, "--"]
        net = f"--net={self.network_of(job_uid)}"
        if self.busybox is not None:  # the same, in BusyBox's words
            return [self.busybox, "nsenter", net, f"-G{uid}", f"-S{uid}", "--"]
        return ["nsenter", net, *ids, "--"]

    def network_of(self, job_uid: int) -> str:
        """The path of the network namespace of this owner's jobs (made at the first call)."""
        held = self._networks.get(job_uid)
        if held is None:
            held = self._networks[job_uid] = _new_network()
        return f"/proc/{os.getpid()}/fd/{held}"

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


def _shared_file(seen: os.stat_result) -> bool:
    """Whether a file of a work dir is root's and has other names: a recorded output frozen
    and placed in a chained task's dir (`shared/host/chained_inputs.py`), or whatever the job
    hard-linked there. It stays as it is: giving it to the job would let it change the other
    names' file."""
    return stat.S_ISREG(seen.st_mode) and seen.st_uid == 0 and seen.st_nlink > 1


def decide(isolation: Isolation, uid_base: int) -> Confinement | None:
    """The confinement this worker gives its jobs, or None (jobs run as the worker's user).
    `CannotConfine` when `on` was asked for and this worker is not root or lacks a tool."""
    if isolation == "off":
        logger.warning("VIGIL_JOB_ISOLATION=off: jobs run as the worker's own user")
        return None
    busybox = shutil.which(BUSYBOX)
    confinement = Confinement(uid_base, busybox=busybox)
    why = _why_not_here()
    if why is None:  # after no_new_privs: it tries the very argv jobs get
        why = _tried(confinement)
        if why is not None and busybox is not None:  # util-linux's, then
            logger.warning("BusyBox's nsenter (%s) cannot confine jobs: %s", busybox, why)
            confinement = Confinement(uid_base)
            why = _tried(confinement)
    if why is not None:
        if isolation == "on":
            raise CannotConfine(f"VIGIL_JOB_ISOLATION=on, but {why}")
        logger.warning("jobs run as the worker's own user, unconfined: %s", why)
        return None
    logger.info(
        "jobs run confined: uid %d + their owner's number, a network namespace each (%s)",
        uid_base,
        f"BusyBox's nsenter, {busybox}" if confinement.busybox else "util-linux's nsenter",
    )
    return confinement


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
    it is not root, util-linux is missing, or `no_new_privs` cannot be set (it is set here)."""
    if os.geteuid() != 0:
        return "the worker is not root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux)"
    return forbid_new_privileges()


def _tried(confinement: Confinement) -> str | None:
    """Why `confinement` cannot confine jobs (None: it can), from one command started the way
    jobs are (`bash -c`, which must be bash: a BusyBox built to run its own shell for `bash`
    would not do), whose ids are checked (uid, gid, no other group): a container without
    CAP_SYS_ADMIN, for one, may not make network namespaces."""
    script = 'test -n "$BASH_VERSION" && exec cat /proc/self/status'
    try:
        tried = subprocess.run(
            [*confinement.argv(0, "none"), "bash", "-c", script],
            cwd="/",  # somewhere the job's uid may be (the worker's own dir may be closed)
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a confined test command failed: {exc}"
    if tried.returncode != 0:
        error = tried.stderr.decode(errors="replace").strip()
        return f"a confined test command failed ({error or tried.returncode})"
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
