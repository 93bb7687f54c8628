"""A directory of a service's own, made safely wherever it is asked for (a pilots dir may be
set under `/tmp`, where anyone may make anything first).

`ensure` makes the last directory itself (mode 0700) and accepts it only if it is a real
directory, not a link, and this process's user's, reached through no link another user could
have planted: every directory above it must be root's or ours, and one that others may write
must be sticky (as `/tmp` is: nobody else may rename or remove what we made there). A dir made
by someone else, or a link where it should be, is refused (`UnsafeDir`, saying which and why):
what the service writes there would go where another user chose.
"""

import contextlib
import os
import stat
from pathlib import Path


class UnsafeDir(Exception):
    """The directory, or one above it, is not one this process may trust."""


def ensure(path: Path) -> Path:
    """`path` (absolute), made if missing with its missing parents, checked as above, and
    given mode 0700; `UnsafeDir` if it cannot be trusted."""
    path = Path(os.path.abspath(path))
    _check_parents(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path = Path(os.path.realpath(path.parent)) / path.name
    _check_parents(path)  # where the links above it lead, too
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    fd = _open_dir(path)
    try:
        seen = os.fstat(fd)
        if seen.st_uid != os.geteuid():
            raise UnsafeDir(
                f"{path} belongs to uid {seen.st_uid}, not to this service's user"
                f" ({os.geteuid()}): remove it or choose another directory"
            )
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def _open_dir(path: Path) -> int:
    """A descriptor of `path` itself, never of what a link there points to."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        kind = "a symbolic link" if path.is_symlink() else "not a directory"
        raise UnsafeDir(f"{path} is {kind} ({exc.strerror}): remove it") from exc


def _check_parents(path: Path) -> None:
    for above in reversed(path.parents):
        _check_above(above)


def _check_above(directory: Path) -> None:
    """`UnsafeDir` unless `directory` (above the one to make) is root's or ours, and, when
    others may write it, sticky; a link there must be root's (`/var/run` is one)."""
    try:
        seen = os.lstat(directory)
    except FileNotFoundError:
        return  # made by us, with its parents, and checked again
    owners = (0, os.geteuid())
    if seen.st_uid not in owners:
        raise UnsafeDir(
            f"{directory} belongs to uid {seen.st_uid}: another user could put a link in its"
            " place or under it; choose a directory of root's or this service's user"
        )
    if stat.S_ISLNK(seen.st_mode):
        return  # root's or ours: where it leads is checked once resolved (`ensure`)
    if seen.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not seen.st_mode & stat.S_ISVTX:
        raise UnsafeDir(
            f"{directory} is writable by others (mode {stat.S_IMODE(seen.st_mode):04o}) and"
            " not sticky: another user could put a link in its place"
        )
