"""A host's cache of store objects, by content: a task's input named by reference (a URL and
its sha256) is fetched once per host, however many tasks here need it.

Layout, under `<work root>/.cache` (root's, 0700: no job sees it; on the work dirs' file system,
so that an entry can be hard-linked into one):

- `objects/<sha256>`: an entry, read-only (0444). It appears only whole and checked: a fetch
  writes a temporary file in `tmp/`, hashing every byte as it is written, syncs it to disk, and
  renames it into place only if its sha256 is the one asked for. A fetch that fails or is cut
  leaves nothing in `objects/` (its temporary file is removed, and `tmp/` is emptied at start).
- `sources/<sha256>/<sha256 of a source>`: the sources (URLs) an entry was fetched from and
  found to hold. A hit needs the very source asked for: an entry is never handed to a task that
  names another source with the same sha256 (that task's source may hold other bytes, and the
  entry may be another user's data whose hash was guessed or leaked); it is fetched from its own
  source once, and checked, first.

The cache holds at most `limit` bytes (`VIGIL_CACHE_BYTES`): the entries least recently used are
removed first, never one in use (held by a task being set up). An object that cannot fit is
fetched for the task alone (`Held.transient`) and never kept.

Concurrent tasks that need one object wait for one fetch (one flight per sha256). An entry is
checked before each use: by its inode, size and modification time against what this process
saw when it wrote or last hashed it, and by its full sha256 when this process has not hashed it
yet (after a restart) or the file changed. A corrupt entry is removed and fetched again. Fetched
bytes that do not match the expected sha256 are fetched once more (a transfer can be cut or
garbled), then refused with `ObjectMismatch`, naming the source and both hashes.

Only the event loop's thread touches the bookkeeping; hashing and disk syncs run in threads.
"""

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shared.domain.sizes import human_size

logger = logging.getLogger(__name__)

#: A sha256 as the cache names entries by it: 64 lowercase hexadecimal digits.
SHA256: Final = re.compile(r"[0-9a-f]{64}")
#: Fetches of one object whose bytes do not match before it is refused.
FETCH_ATTEMPTS: Final = 2
_CHUNK: Final = 1 << 20


class ObjectMismatch(Exception):
    """An object's fetched bytes do not have the sha256 expected of them."""

    def __init__(self, source: str, expected: str, got: str, size: int) -> None:
        super().__init__(
            f"{source}: its bytes ({human_size(size)}) have sha256 {got}, not the {expected}"
            " expected"
        )
        self.source, self.expected, self.got, self.size = source, expected, got, size


@dataclass(frozen=True)
class Wanted:
    """An object a task needs: its sha256, where it is fetched from, its size if known."""

    sha256: str
    source: str
    size: int | None = None


class Sink:
    """Where a fetch writes an object's bytes, in order: a new file, hashed as written."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        self._digest.update(view)
        self.size += len(view)
        while view:
            view = view[os.write(self._fd, view) :]

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


#: Writes an object's bytes into the sink, from the first byte (an error: the fetch failed).
Fetch = Callable[[Sink], Awaitable[None]]


@dataclass(frozen=True)
class Held:
    """An object in use by one task: its file, until the hold ends. A `transient` one is the
    task's alone (too large for the cache): its file is removed when the hold ends."""

    path: Path
    transient: bool


@dataclass
class _Entry:
    size: int
    #: (inode, size, mtime in ns) when this process last wrote or hashed the file whole.
    checked: tuple[int, int, int] | None = None


@dataclass
class _Flight:
    """One fetch (or check) of an object under way, which other tasks needing it wait for."""

    source: str
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ObjectCache:
    """The host's cache of objects (see the module's docstring). `open()` it once, at start."""

    def __init__(self, root: Path, limit: int, *, attempts: int = FETCH_ATTEMPTS) -> None:
        self.root = root
        self.limit = limit
        self._attempts = attempts
        self._objects = root / "objects"
        self._sources = root / "sources"
        self._tmp = root / "tmp"
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._pins: dict[str, int] = {}
        self._flights: dict[str, _Flight] = {}
        self._used = 0
        self._reserved = 0  # bytes of fetches under way that made room for themselves
        #: Counters, for benchmarks and tests: fetches begun, bytes fetched, hits, entries
        #: found corrupt.
        self.fetches = 0
        self.fetched_bytes = 0
        self.hits = 0
        self.corrupt = 0

    @property
    def used(self) -> int:
        """Bytes the entries hold."""
        return self._used

    def open(self) -> None:
        """Make the dirs (root's, 0700), drop what an earlier run left half-fetched, and read
        the entries there, least recently used first (by their access time, which each use
        sets); then keep within the limit."""
        for directory in (self.root, self._objects, self._sources, self._tmp):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        shutil.rmtree(self._tmp)
        self._tmp.mkdir(mode=0o700)
        found: list[tuple[int, str, int]] = []
        for item in os.scandir(self._objects):
            seen = item.stat(follow_symlinks=False)
            if SHA256.fullmatch(item.name) and item.is_file(follow_symlinks=False):
                found.append((seen.st_atime_ns, item.name, seen.st_size))
            else:  # not the cache's: never handed out
                _remove(Path(item.path))
        self._entries = OrderedDict((name, _Entry(size)) for _, name, size in sorted(found))
        self._used = sum(size for _, _, size in found)
        self._trim(0)

    @contextlib.asynccontextmanager
    async def held(self, wanted: Wanted, fetch: Fetch) -> AsyncIterator[Held]:
        """The object's checked file while the block runs (fetched with `fetch` unless the
        cache holds it from that very source). `ObjectMismatch` when the source's bytes are
        not the expected ones; whatever `fetch` raises when it fails."""
        if not SHA256.fullmatch(wanted.sha256):
            raise ValueError(f"{wanted.sha256!r} is not a sha256 (64 lowercase hex digits)")
        held = await self._obtain(wanted, fetch)
        try:
            yield held
        finally:
            if held.transient:
                _remove(held.path)
            else:
                self._unpin(wanted.sha256)

    async def _obtain(self, wanted: Wanted, fetch: Fetch) -> Held:
        while True:
            flight = self._flights.get(wanted.sha256)
            if flight is None:
                break
            await asyncio.wait([flight.done])
            failed = None if flight.done.cancelled() else flight.done.exception()
            if failed is not None and flight.source == wanted.source:
                raise failed  # the same source just failed: so does this task
        if self._is_fresh(wanted):  # the common hit: one stat, no flight
            return self._hit(wanted.sha256)
        flight = self._flights[wanted.sha256] = _Flight(wanted.source)
        flight.done.add_done_callback(_retrieved)
        try:
            held = await self._make(wanted, fetch)
        except asyncio.CancelledError:
            flight.done.cancel()  # its waiters try again, one of them fetching
            raise
        except BaseException as exc:
            flight.done.set_exception(exc)
            raise
        else:
            flight.done.set_result(None)
            return held
        finally:
            del self._flights[wanted.sha256]

    def _is_fresh(self, wanted: Wanted) -> bool:
        """Whether the entry is there, unchanged since this process checked it, and known to
        be what `wanted.source` holds."""
        entry = self._entries.get(wanted.sha256)
        return (
            entry is not None
            and entry.checked is not None
            and entry.checked == _identity(self._path(wanted.sha256))
            and self._known(wanted)
        )

    async def _make(self, wanted: Wanted, fetch: Fetch) -> Held:
        """Check the entry (removing a corrupt one), or fetch the object into it."""
        sha = wanted.sha256
        entry = self._entries.get(sha)
        if entry is not None and not await self._check(sha, entry):
            self.corrupt += 1
            logger.warning("cache entry %s does not match its sha256: removed, fetched again", sha)
            self._evict(sha)
            entry = None
        if entry is not None and self._known(wanted):
            return self._hit(sha)
        reserve = wanted.size if wanted.size is not None and entry is None else 0
        if reserve and not self._room(reserve):
            reserve = 0  # cannot fit: the task's alone
        self._reserved += reserve
        try:
            path, size = await self._fetch(wanted, fetch)
        finally:
            self._reserved -= reserve
        return self._keep(wanted, path, size)

    def _keep(self, wanted: Wanted, path: Path, size: int) -> Held:
        """Make the fetched, checked file `path` the entry (unless one is there), or the task's
        alone when it cannot fit."""
        sha = wanted.sha256
        if sha in self._entries:  # was there, from another source: the same bytes
            _remove(path)
        else:
            if not self._room(size):
                return Held(path, transient=True)
            os.rename(path, self._path(sha))
            self._entries[sha] = _Entry(size, _identity(self._path(sha)))
            self._used += size
        self._learn(wanted)
        self._pin(sha)
        return Held(self._path(sha), transient=False)

    async def _check(self, sha: str, entry: _Entry) -> bool:
        """Whether the entry's file still holds its sha256 (hashed whole unless unchanged since
        this process last did)."""
        path = self._path(sha)
        seen = _identity(path)
        if seen is not None and seen == entry.checked:
            return True
        if seen is None or seen[1] != entry.size:
            return False
        if await asyncio.to_thread(_sha256_of, path) != sha:
            return False
        entry.checked = _identity(path)
        return entry.checked == seen

    async def _fetch(self, wanted: Wanted, fetch: Fetch) -> tuple[Path, int]:
        """The object fetched into a new temporary file, synced and read-only, whose sha256
        is the one wanted (fetched again once if not), and its size; `ObjectMismatch` if it
        never is."""
        mismatch: ObjectMismatch | None = None
        for _ in range(self._attempts):
            fd, name = tempfile.mkstemp(prefix=f"{wanted.sha256[:16]}-", dir=self._tmp)
            path = Path(name)
            self.fetches += 1
            try:
                sink = Sink(fd)
                try:
                    await fetch(sink)
                    await asyncio.to_thread(_seal, fd)
                finally:
                    os.close(fd)
                    self.fetched_bytes += sink.size
            except BaseException:
                _remove(path)
                raise
            if sink.sha256 == wanted.sha256:
                return path, sink.size
            _remove(path)
            mismatch = ObjectMismatch(wanted.source, wanted.sha256, sink.sha256, sink.size)
            logger.warning("fetched %s", mismatch)
        assert mismatch is not None  # at least one attempt
        raise mismatch

    def _room(self, size: int) -> bool:
        """Remove entries, least recently used first and never one in use, until `size` more
        bytes fit within the limit; whether they do."""
        self._trim(size)
        return self.used + self._reserved + size <= self.limit

    def _trim(self, size: int) -> None:
        for sha in list(self._entries):
            if self.used + self._reserved + size <= self.limit:
                return
            if not self._pins.get(sha) and sha not in self._flights:
                self._evict(sha)

    def _hit(self, sha: str) -> Held:
        self.hits += 1
        self._pin(sha)
        return Held(self._path(sha), transient=False)

    def _pin(self, sha: str) -> None:
        """Mark the entry in use (never removed until unpinned) and most recently used."""
        self._pins[sha] = self._pins.get(sha, 0) + 1
        self._entries.move_to_end(sha)
        path = self._path(sha)
        with contextlib.suppress(FileNotFoundError):  # its access time orders it after a restart
            os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))

    def _unpin(self, sha: str) -> None:
        left = self._pins.get(sha, 0) - 1
        if left > 0:
            self._pins[sha] = left
        else:
            self._pins.pop(sha, None)

    def _evict(self, sha: str) -> None:
        self._used -= self._entries.pop(sha).size
        _remove(self._path(sha))
        shutil.rmtree(self._sources / sha, ignore_errors=True)

    def _known(self, wanted: Wanted) -> bool:
        return (self._sources / wanted.sha256 / _name_of(wanted.source)).exists()

    def _learn(self, wanted: Wanted) -> None:
        """Note that `wanted.source` was found to hold the entry's bytes."""
        directory = self._sources / wanted.sha256
        directory.mkdir(mode=0o700, exist_ok=True)
        (directory / _name_of(wanted.source)).touch(mode=0o600)

    def _path(self, sha: str) -> Path:
        return self._objects / sha


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What a change of the file's bytes changes: its inode, size and modification time (a
    link to it, which changes only its ctime, does not)."""
    try:
        seen = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return seen.st_ino, seen.st_size, seen.st_mtime_ns


def _seal(fd: int) -> None:
    """Make the fetched file read-only and durable before it may be renamed into place."""
    os.fchmod(fd, 0o444)
    os.fsync(fd)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _name_of(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _retrieved(done: asyncio.Future[None]) -> None:
    """Mark a flight's failure seen (its waiters may all be gone)."""
    if not done.cancelled():
        done.exception()
