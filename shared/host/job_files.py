"""Opening files in a work dir a job controls (its status file, its outputs; the worker's own
files there: the input, the run logs) without trusting what the job left in it.

Anything under a work dir may have been made by the job: a FIFO (whose read waits for a writer
for ever), a device (`/dev/zero` never ends), a symbolic link to a file of the services or of
another job, or a directory link half-way down the path. `open_regular()` walks the path from
the work dir one component at a time, refusing a symbolic link at every step (`O_NOFOLLOW`),
opens the last one without blocking (`O_NONBLOCK`: a FIFO opens at once), and accepts only a
regular file. What it refuses raises `UnsafeFile`, whose message says why in words a user can
act on.
"""

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Final, TextIO

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
    fd = _open_file(root, relative, _FILE_FLAGS)
    with os.fdopen(fd, "rb") as handle:
        yield handle


def open_append(root: Path, relative: str | Path) -> TextIO:
    """The regular file `relative` under `root` opened for appending text (made, mode 0644, if
    missing; its missing directories too), through no link, symbolic or hard: a job cannot
    point a file the worker writes at anything outside its work dir. The caller closes it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = _open_file(root, relative, flags, create_dirs=True, one_name=True)
    return os.fdopen(fd, "a", encoding="utf-8")


def write_file(root: Path, relative: str | Path, data: bytes) -> None:
    """Replace the contents of the regular file `relative` under `root` (made if missing, its
    directories too), through no link, symbolic or hard."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = _open_file(root, relative, flags, create_dirs=True, one_name=True)
    with os.fdopen(fd, "wb") as handle:
        handle.truncate()
        handle.write(data)


def make_dirs(root: Path, relative: str | Path) -> None:
    """The directory `relative` under `root` and its parents, through no link (`.`: `root`)."""
    os.close(open_dir(root, relative))


def check_plain_name(name: str, what: str) -> None:
    """`UnsafeFile` unless `name` is a plain file name of a work dir (no `/`, not `.`, `..` or
    the worker's `.vigil`, no NUL): `what` says what it names, for the message."""
    if "/" in name or name in ("", ".", "..", ".vigil") or "\0" in name:
        raise UnsafeFile(f"{name!r} is not a plain file name for {what}")


def write_new(
    name: str | Path, chunks: Iterable[bytes], mode: int, *, dir_fd: int | None = None
) -> None:
    """Make the file `name` (relative to `dir_fd` if given) with `chunks` as its bytes, then
    give it `mode`: only a new file (`O_EXCL`: never one the job made, never through a link).
    Its owner is this process's user (root's, on a confining worker)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def open_dir(root: Path, relative: str | Path) -> int:
    """A descriptor of the directory `relative` under `root` (made with its parents if
    missing; `.`: `root`), reached through no link. The caller closes it."""
    return _open_dir(root, _parts(relative, allow_root=True), create=True)


def remove_file(root: Path, relative: str | Path) -> None:
    """Remove `relative` under `root` if it is there (a link itself, never what it points at)."""
    parts = _parts(relative)
    try:
        dir_fd = _open_dir(root, parts[:-1], create=False)
    except FileNotFoundError:
        return
    try:
        os.unlink(parts[-1], dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dir_fd)


def _parts(relative: str | Path, *, allow_root: bool = False) -> tuple[str, ...]:
    path = PurePosixPath(relative)
    if (not path.parts and not allow_root) or path.is_absolute() or ".." in path.parts:
        raise UnsafeFile(f"{str(relative)!r} is not a plain path inside the work dir")
    return path.parts


def _open_dir(root: Path, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of `root`/`parts`, each step opened without following a link."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            step = _open_step(part, fd, _DIR_FLAGS, "/".join(parts))
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(
    root: Path,
    relative: str | Path,
    flags: int,
    *,
    create_dirs: bool = False,
    one_name: bool = False,
) -> int:
    """A descriptor of the regular file `relative` under `root` (see `open_regular`); with
    `one_name`, only of a file that has no other name (a hard link the job made to a file of
    its own elsewhere would have the worker write there: where the kernel lets it link files
    it does not own, `fs.protected_hardlinks` 0, one of anybody's)."""
    parts = _parts(relative)
    dir_fd = _open_dir(root, parts[:-1], create=create_dirs)
    try:
        fd = _open_step(parts[-1], dir_fd, flags, relative, mode=0o644)
    finally:
        os.close(dir_fd)
    try:
        seen = os.fstat(fd)
        mode = seen.st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(f"{str(relative)!r} is not a regular file ({_kind(mode)})")
        if one_name and seen.st_nlink > 1:
            raise UnsafeFile(f"{str(relative)!r} has other names (hard links): not written")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(root: Path, relative: str | Path, *, max_bytes: int) -> bytes:
    """The whole of `open_regular(root, relative)`, refused (`UnsafeFile`) past `max_bytes`."""
    with open_regular(root, relative) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{str(relative)!r} is larger than {max_bytes} bytes")
    return data


def _open_step(
    name: str, dir_fd: int, flags: int, relative: str | Path, *, mode: int = 0o777
) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
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
