"""Opening files a job controls (its status file, its outputs) without trusting them.

Anything under a work dir may have been made by the job: a FIFO (whose read waits for a writer
for ever), a device (`/dev/zero` never ends), a symbolic link to a file of the services or of
another job, or a directory link half-way down the path. `open_regular()` walks the path from
the work dir one component at a time, refusing a symbolic link at every step (`O_NOFOLLOW`),
opens the last one without blocking (`O_NONBLOCK`: a FIFO opens at once), and accepts only a
regular file. What it refuses raises `UnsafeFile`, whose message says why in words a user can
act on.
"""

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Final

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(Exception):
    """A job's file that is not a plain regular file inside its work dir."""


@contextmanager
def open_regular(root: Path, relative: str | Path) -> Iterator[BinaryIO]:
    """The regular file `relative` under the directory `root`, opened for reading.

    `FileNotFoundError` when it does not exist; `UnsafeFile` when `relative` is absolute or
    climbs out (`..`), or any component is a symbolic link, or the file is not a regular one.
    """
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
        raise UnsafeFile(f"{str(relative)!r} is not a plain path inside the work dir")
    fds: list[int] = []
    try:
        fds.append(os.open(root, _DIR_FLAGS))
        for part in parts[:-1]:
            fds.append(_open_step(part, fds[-1], _DIR_FLAGS, relative))
        fd = _open_step(parts[-1], fds[-1], _FILE_FLAGS, relative)
    finally:
        for opened in fds:
            os.close(opened)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(f"{str(relative)!r} is not a regular file ({_kind(mode)})")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def read_regular(root: Path, relative: str | Path, *, max_bytes: int) -> bytes:
    """The whole of `open_regular(root, relative)`, refused (`UnsafeFile`) past `max_bytes`."""
    with open_regular(root, relative) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{str(relative)!r} is larger than {max_bytes} bytes")
    return data


def _open_step(name: str, dir_fd: int, flags: int, relative: str | Path) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP: the last component is a symbolic link; ENOTDIR: a directory one is (or is a
        # file); ENXIO: a socket.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            raise UnsafeFile(
                f"{str(relative)!r} goes through {name!r}, which is a symbolic link or not a"
                " regular file or directory"
            ) from exc
        raise


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"
