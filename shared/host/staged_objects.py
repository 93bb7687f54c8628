"""An object from the host's cache (`shared/host/object_cache.py`) placed in a task's work
dir, read-only, by its path there.

A hard link where the job cannot write the entry's inode: a confined job runs as a uid of its
own, and the entry is root's and 0444, so the job reads it and can change neither it nor,
through it, the cache or another task's copy (`Confinement.hand_over` leaves a root's file with
other names as it is). It costs no copy and no disk: 100 tasks that share a 200 MB input hold
one 200 MB file. Where jobs run as the worker's own user (unconfined), a link would let the job
make the entry writable and change it under every other task: the file is copied instead
(a reflink where the file system shares blocks, else a copy in the kernel). A copy, too, across
file systems. A file the task alone holds (`Held.transient`) is linked: no other name is left
once its hold ends.
"""

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Final

from shared.host import job_files

#: ioctl(2) request: make the file share the blocks of another (`FICLONE`, Linux).
_FICLONE: Final = 0x40049409
_READ_ONLY: Final = 0o444


def place(
    source: Path, workdir: Path, relative: str, *, link: bool, mode: int = _READ_ONLY
) -> None:
    """Put the file `source` in `workdir` as `relative` (its dirs made as needed, through no
    link), replacing whatever had that name (a link is replaced, never followed): a hard link
    of it when `link` (with the entry's mode, 0444), else a copy of mode `mode`."""
    parent, _, name = relative.rpartition("/")
    dir_fd = job_files.open_dir(workdir, parent or ".")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)  # a rerun's, or what the job put there
        if link:
            try:
                os.link(source, name, dst_dir_fd=dir_fd, follow_symlinks=False)
                return
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
        _copy(source, name, dir_fd, mode)
    finally:
        os.close(dir_fd)


def _copy(source: Path, name: str, dir_fd: int, mode: int) -> None:
    """A new file `name` (never one the job made: `O_EXCL`) with the bytes of `source`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as handle:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        try:
            if not _reflinked(handle.fileno(), fd):
                _copy_range(handle.fileno(), fd, os.fstat(handle.fileno()).st_size)
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=dir_fd)
            raise
        os.close(fd)


def _reflinked(src: int, dst: int) -> bool:
    try:
        fcntl.ioctl(dst, _FICLONE, src)
    except OSError:
        return False  # not a file system that shares blocks (or not the same one)
    return True


def _copy_range(src: int, dst: int, size: int) -> None:
    copied = 0
    while copied < size:
        step = os.copy_file_range(src, dst, size - copied)
        if step == 0:
            raise OSError(errno.EIO, f"the file ended at {copied} of {size} bytes while copied")
        copied += step
