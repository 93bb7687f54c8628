"""A job's files on a host (`<work root>/<job>/.files`) are its owner's jobs' to read and run,
and nobody else's: another user's job that learns the job's id (ids are in the services' logs)
can neither list them nor read them, and the owner's job cannot change them."""

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.domain import bundle
from shared.host import bundle as host_bundle
from tests.conftest import require_root


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root("running commands as jobs' uids")


#: The uid (and gid) of the job's owner's commands, and of another user's.
OWNER, OTHER = 2_000_011, 2_000_012


@pytest.fixture
def work_root() -> Iterator[Path]:
    """A work root the jobs' uids can reach (pytest's own tmp dir is private to root)."""
    with tempfile.TemporaryDirectory(prefix="vigil-job-files-", dir="/tmp") as made:
        root = Path(made)
        root.chmod(0o711)
        yield root / "work"


def _as(uid: int, script: str) -> subprocess.CompletedProcess[str]:
    """`sh -c script` as `uid` and gid `uid`, in no other group (a confined job's ids)."""
    return subprocess.run(
        ["sh", "-c", script],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd="/",
    )


def _placed(work_root: Path) -> Path:
    """The files of job `j-1` of OWNER placed for its task `t-1` (its dirs as the worker
    leaves them: the work root and the job's dir root's, 0711); the host's copy."""
    files = bundle.listed({"secret.conf": (b"password=1\n", False), "bin/run": (b"true\n", True)})
    contents = {"secret.conf": b"password=1\n", "bin/run": b"true\n"}
    workdir = work_root / "j-1" / "t-1"
    workdir.mkdir(parents=True)
    host_bundle.place(work_root, "j-1", files, contents, workdir, OWNER)
    for directory in (work_root, work_root / "j-1"):
        directory.chmod(0o711)
    return host_bundle.on_host(work_root, "j-1")


def test_another_users_job_can_neither_list_nor_read_a_jobs_files(work_root: Path) -> None:
    kept = _placed(work_root)

    listed = _as(OTHER, f"ls {kept}")
    read = _as(OTHER, f"cat {kept}/secret.conf")

    assert listed.returncode != 0 and "Permission denied" in listed.stderr
    assert read.returncode != 0 and "Permission denied" in read.stderr


def test_the_owners_job_reads_and_runs_its_files_and_cannot_change_them(
    work_root: Path,
) -> None:
    kept = _placed(work_root)

    read = _as(OWNER, f"cat {kept}/secret.conf && {kept}/bin/run && echo ran")
    written = _as(OWNER, f"echo x >> {kept}/secret.conf")
    removed = _as(OWNER, f"rm -f {kept}/secret.conf")

    assert read.stdout == "password=1\nran\n", read.stderr
    assert written.returncode != 0 and removed.returncode != 0
    assert (kept / "secret.conf").read_bytes() == b"password=1\n"
