"""A job's bundle on a host: its files written once under `<work root>/<job>/.files`, and
hard-linked into each task's work dir at setup, by their paths. The copy is the worker's (root's
on a confining worker) with the group of the job's owner (`group`: a confined job runs as uid
and gid `VIGIL_JOB_UID_BASE` + its owner's `users.job_uid`), its dirs 0750 and its files 0440
(0550 for an executable): the owner's jobs read and run them, another user's job, knowing the
job's id, cannot even list them. A hard link of the worker's read-only file stays the worker's
when the work dir is given to the job (`Confinement.hand_over` leaves a root's file with other
names as it is): the job cannot change it, nor through it another task's.

The host's copy is written to a temporary dir (0700 until it is whole) and renamed into place,
so a task never sees a half-written bundle, and two tasks set up at once on one host both end
with the same one.
"""

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from shared.domain.bundle import HOST_DIR, BundleFile
from shared.host import job_files


class BundleUnavailable(Exception):
    """The job's files cannot be placed (their bytes are gone, or do not match their list)."""


def on_host(work_root: Path, job_id: str) -> Path:
    """Where the job's files are kept on this host."""
    return work_root / job_id / HOST_DIR


def place(
    work_root: Path,
    job_id: str,
    files: list[BundleFile],
    contents: Mapping[str, bytes] | None,
    workdir: Path,
    group: int,
) -> None:
    """Put the job's files in `workdir` by their paths (writing the host's copy first from
    `contents` if it is not there yet, readable by `group`: the gid the job's commands run
    with). `BundleUnavailable` when it cannot be had."""
    kept = on_host(work_root, job_id)
    if not kept.is_dir():
        if contents is None:
            raise BundleUnavailable(f"the job's files are not on this host ({kept})")
        _write(kept, files, contents, group)
    workdir.mkdir(parents=True, exist_ok=True)  # the dirs above it are the worker's
    for file in files:
        parent, _, name = file.path.rpartition("/")
        dir_fd = job_files.open_dir(workdir, parent or ".")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)  # a rerun's, or what the job put there
            os.link(kept / file.path, name, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(dir_fd)


def _write(kept: Path, files: list[BundleFile], contents: Mapping[str, bytes], group: int) -> None:
    """Write the host's copy of the files in a temporary dir beside `kept`, give it to
    `group`, then rename it."""
    missing = [f.path for f in files if f.path not in contents]
    if missing:
        raise BundleUnavailable(
            f"the bytes of the job's files are gone ({len(missing)} of {len(files)}, e.g."
            f" {missing[0]!r}): a purge deletes them"
        )
    kept.parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=f"{HOST_DIR}-", dir=kept.parent))
    try:
        for file in files:
            content = contents[file.path]
            if hashlib.sha256(content).hexdigest() != file.sha256:
                raise BundleUnavailable(f"the bytes of {file.path!r} do not match its sha256")
            path = made / file.path
            path.parent.mkdir(parents=True, exist_ok=True)
            job_files.write_new(path, (content,), 0o550 if file.executable else 0o440)
            os.chown(path, -1, group, follow_symlinks=False)
        for directory, _, _ in os.walk(made, topdown=False):  # the top one last
            os.chown(directory, -1, group, follow_symlinks=False)
            os.chmod(directory, 0o750)
        try:
            os.rename(made, kept)
        except OSError as exc:  # another task of the job wrote it first: theirs is the same
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(made, ignore_errors=True)
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise
