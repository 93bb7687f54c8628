"""A chained task's inputs: the outputs of its owner's upstream task, placed in its work dir.

An upstream output is *frozen* once recorded (`freeze`): where the worker is root, the file
becomes root's and read-only (0444), so the jobs of its owner's uid can read it and no job can
change it. A chained task gets it as a hard link of that very file in its own work dir (no
copy, and it stays readable after the upstream work dir is removed); where the two are on
different file systems, as a read-only copy; where the file is not on this host (the upstream
task ran on another, or its work dir was purged), from the bytes kept in the database
(outputs up to `VIGIL_OUTPUT_KEEP_BYTES`), checked against the recorded sha256. An output kept
in the object store and not on this host is not placed here: the worker stages it in from the
store, through the host's cache, before the setup (`services/worker/stage_in.py`). Otherwise
the chained task's setup fails with `InputUnavailable`, saying which output, where it was and
why it cannot be had.

A file the upstream job was given back (a restart hands its work dir to its uid again, with
the outputs that no chained task shares) is checked against the recorded size and sha256
before it is frozen again and linked: a job cannot pass a changed file off as its recorded
output. See docs/explanation/security.md, "What a job may read and write".
"""

import contextlib
import errno
import hashlib
import os
from pathlib import Path
from typing import Final

from shared.domain.outputs import UpstreamOutput
from shared.domain.sizes import human_size
from shared.host import job_files

_READ_ONLY: Final = 0o444


class InputUnavailable(Exception):
    """An upstream output a chained task needs that cannot be placed in its work dir."""


def freeze(fd: int) -> None:
    """Make the open file root's and read-only, where this process is root (elsewhere the jobs
    run as the worker's own user, and nothing a job may not undo can be done)."""
    if os.geteuid() == 0:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, _READ_ONLY)


def is_frozen(seen: os.stat_result) -> bool:
    """Whether a file is as `freeze` left it (root's, writable by nobody)."""
    return seen.st_uid == 0 and not seen.st_mode & 0o222


def place(work_root: Path, workdir: Path, name: str, output: UpstreamOutput) -> None:
    """Put `output` in `workdir` as `name` (a plain file name), read-only, replacing whatever
    had that name (a link is replaced, never followed). `UnsafeFile` for a name or a recorded
    path that is not plain, `InputUnavailable` when the output cannot be had."""
    job_files.check_plain_name(name, "a chained input")
    if output.object_key is not None:  # staged in from the store before the setup
        return
    source = Path(os.path.normpath(output.path))
    if not source.is_relative_to(work_root) or source == work_root:
        raise job_files.UnsafeFile(f"{output.path!r} is not a file of a task's work dir")
    dir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)  # an older copy, or anything the job put there
        try:
            with job_files.open_regular(work_root, source.relative_to(work_root)) as handle:
                if _is_recorded(handle.fileno(), output):
                    _link_or_copy(handle.fileno(), dir_fd, name)
                    return
                why = "it changed since it was recorded"
        except FileNotFoundError:
            why = "it is not on this host"
        _write_kept(dir_fd, name, output, why)
    finally:
        os.close(dir_fd)


def _is_recorded(fd: int, output: UpstreamOutput) -> bool:
    """Whether the open file is the recorded output: its size, and its sha256 unless it is
    frozen (then no job can have changed it since the worker recorded it)."""
    seen = os.fstat(fd)
    if seen.st_size != output.size:
        return False
    if is_frozen(seen) or os.geteuid() != 0:  # unconfined jobs are the worker's own user
        freeze(fd)
        return True
    digest = hashlib.sha256()
    for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(chunk)
    if digest.hexdigest() != output.sha256:
        return False
    freeze(fd)
    return True


def _link_or_copy(fd: int, dir_fd: int, name: str) -> None:
    """A hard link of the open (frozen) file as `name`, or a read-only copy of it across file
    systems."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    os.lseek(fd, 0, os.SEEK_SET)
    job_files.write_new(name, iter(lambda: os.read(fd, 1 << 20), b""), _READ_ONLY, dir_fd=dir_fd)


def _write_kept(dir_fd: int, name: str, output: UpstreamOutput, why: str) -> None:
    """`name` from the output's bytes kept in the database, or `InputUnavailable` saying why
    the file could not be used and the bytes are not there."""
    content = output.content
    if content is not None and hashlib.sha256(content).hexdigest() == output.sha256:
        job_files.write_new(name, (content,), _READ_ONLY, dir_fd=dir_fd)
        return
    where = f"{output.path} on host {output.host}" if output.host else output.path
    kept = (
        "its bytes were not kept in the database"
        + (f" ({output.not_kept})" if output.not_kept else f" ({human_size(output.size)})")
        if content is None
        else "the bytes kept in the database do not match its sha256"
    )
    raise InputUnavailable(
        f"output {output.name!r} of task {output.task_id} ({where}) cannot be used: {why}, and"
        f" {kept}; recover or restart task {output.task_id} to make it again"
    )
