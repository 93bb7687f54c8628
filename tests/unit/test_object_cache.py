"""The host's object cache (`shared/host/object_cache.py`) and the placing of its entries in a
work dir (`shared/host/staged_objects.py`), on real files: objects are fetched from a directory
standing for a store, read in chunks in a thread as a store's client streams them."""

import asyncio
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shared.host import staged_objects
from shared.host.object_cache import Fetch, ObjectCache, ObjectMismatch, Sink, Wanted


@dataclass
class Shelf:
    """A directory of objects, by name, and what was read from it."""

    root: Path
    gets: int = 0
    #: Names whose read is cut after this many bytes (a dropped connection).
    cut_after: dict[str, int] = field(default_factory=dict)
    #: Set to let the reads go on (they wait for it: so that concurrent tasks overlap).
    go: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, name: str, data: bytes) -> Wanted:
        (self.root / name).write_bytes(data)
        return Wanted(hashlib.sha256(data).hexdigest(), f"shelf://{name}", len(data))

    def fetch(self, name: str) -> Fetch:
        async def fetch(sink: Sink) -> None:
            self.gets += 1
            await self.go.wait()
            limit = self.cut_after.get(name)
            with (self.root / name).open("rb") as handle:
                while chunk := await asyncio.to_thread(handle.read, 64 * 1024):
                    if limit is not None and sink.size + len(chunk) > limit:
                        sink.write(chunk[: limit - sink.size])
                        raise ConnectionResetError(f"{name}: the connection dropped")
                    sink.write(chunk)

        return fetch


@pytest.fixture
def shelf(tmp_path: Path) -> Shelf:
    (tmp_path / "shelf").mkdir()
    made = Shelf(tmp_path / "shelf")
    made.go.set()
    return made


def _cache(tmp_path: Path, limit: int = 10 * 1024 * 1024) -> ObjectCache:
    cache = ObjectCache(tmp_path / "cache", limit)
    cache.open()
    return cache


def _listed(cache: ObjectCache) -> list[str]:
    return sorted(os.listdir(cache.root / "objects")) + sorted(os.listdir(cache.root / "tmp"))


async def test_tasks_sharing_an_object_fetch_it_once(tmp_path: Path, shelf: Shelf) -> None:
    cache = _cache(tmp_path)
    data = os.urandom(3 * 1024 * 1024 + 7)
    wanted = shelf.put("genome.fa", data)
    shelf.go.clear()

    async def task(n: int) -> bytes:
        async with cache.held(wanted, shelf.fetch("genome.fa")) as held:
            workdir = tmp_path / f"task{n}"
            workdir.mkdir()
            staged_objects.place(held.path, workdir, "ref/genome.fa", link=True)
            return (workdir / "ref" / "genome.fa").read_bytes()

    running = [asyncio.create_task(task(n)) for n in range(20)]
    await asyncio.sleep(0)  # all of them are waiting on the one fetch
    shelf.go.set()
    got = await asyncio.wait_for(asyncio.gather(*running), 30)
    assert all(content == data for content in got)
    assert (shelf.gets, cache.fetches, cache.fetched_bytes) == (1, 1, len(data))
    assert cache.hits == 19
    entry = cache.root / "objects" / wanted.sha256
    assert entry.stat().st_nlink == 21  # the entry and one link per task: no copy
    assert entry.stat().st_mode & 0o777 == 0o444


async def test_a_cut_fetch_leaves_nothing_that_looks_complete(tmp_path: Path, shelf: Shelf) -> None:
    cache = _cache(tmp_path)
    data = os.urandom(1024 * 1024)
    wanted = shelf.put("cut.bin", data)
    shelf.cut_after["cut.bin"] = 300_000
    with pytest.raises(ConnectionResetError):
        async with cache.held(wanted, shelf.fetch("cut.bin")):
            pytest.fail("a cut fetch is never held")
    assert _listed(cache) == []
    del shelf.cut_after["cut.bin"]
    async with cache.held(wanted, shelf.fetch("cut.bin")) as held:
        assert held.path.read_bytes() == data
    assert shelf.gets == 2


async def test_bytes_that_do_not_match_are_fetched_again_then_refused(
    tmp_path: Path, shelf: Shelf
) -> None:
    cache = _cache(tmp_path)
    wanted = shelf.put("said.bin", b"what the user said")
    shelf.put("said.bin", b"what the store holds")
    with pytest.raises(ObjectMismatch) as refused:
        async with cache.held(wanted, shelf.fetch("said.bin")):
            pytest.fail("wrong bytes are never held")
    held_sha = hashlib.sha256(b"what the store holds").hexdigest()
    assert str(refused.value) == (
        f"shelf://said.bin: its bytes (20 B) have sha256 {held_sha}, not the {wanted.sha256}"
        " expected"
    )
    assert shelf.gets == 2  # once more: a transfer may be garbled
    assert _listed(cache) == []


async def test_a_corrupt_entry_is_found_removed_and_fetched_again(
    tmp_path: Path, shelf: Shelf
) -> None:
    cache = _cache(tmp_path)
    data = os.urandom(200_000)
    wanted = shelf.put("data.bin", data)
    async with cache.held(wanted, shelf.fetch("data.bin")):
        pass
    entry = cache.root / "objects" / wanted.sha256
    with entry.open("r+b") as handle:  # as root: the mode does not stop it
        handle.write(b"rot")
    async with cache.held(wanted, shelf.fetch("data.bin")) as held:
        assert held.path.read_bytes() == data
    assert (shelf.gets, cache.corrupt) == (2, 1)


async def test_an_entry_corrupted_at_rest_is_found_after_a_restart(
    tmp_path: Path, shelf: Shelf
) -> None:
    data = os.urandom(200_000)
    wanted = shelf.put("data.bin", data)
    async with _cache(tmp_path).held(wanted, shelf.fetch("data.bin")):
        pass
    entry = tmp_path / "cache" / "objects" / wanted.sha256
    kept = entry.stat()
    with entry.open("r+b") as handle:  # a flipped block: same size, same times
        handle.write(bytes(b ^ 0xFF for b in handle.read(16)))
    os.utime(entry, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    restarted = _cache(tmp_path)
    async with restarted.held(wanted, shelf.fetch("data.bin")) as held:
        assert held.path.read_bytes() == data
    assert (shelf.gets, restarted.corrupt) == (2, 1)
    async with restarted.held(wanted, shelf.fetch("data.bin")):  # checked now: a plain hit
        pass
    assert (shelf.gets, restarted.hits) == (2, 1)


async def test_entries_survive_a_restart(tmp_path: Path, shelf: Shelf) -> None:
    wanted = shelf.put("data.bin", b"kept across a restart")
    async with _cache(tmp_path).held(wanted, shelf.fetch("data.bin")):
        pass
    (tmp_path / "cache" / "tmp" / "left-by-a-crash").write_bytes(b"half")
    restarted = _cache(tmp_path)
    assert os.listdir(restarted.root / "tmp") == []
    async with restarted.held(wanted, shelf.fetch("data.bin")) as held:
        assert held.path.read_bytes() == b"kept across a restart"
    assert (shelf.gets, restarted.hits) == (1, 1)  # hashed at its first use, not fetched


async def test_the_least_recently_used_go_first_never_one_in_use(
    tmp_path: Path, shelf: Shelf
) -> None:
    cache = _cache(tmp_path, limit=3 * 1000)
    wanted = {name: shelf.put(name, os.urandom(1000)) for name in "abcd"}

    async def use(name: str) -> None:
        async with cache.held(wanted[name], shelf.fetch(name)):
            pass

    for name in "abc":
        await use(name)
    await use("a")
    async with cache.held(wanted["b"], shelf.fetch("b")):  # b in use: c goes instead
        await use("d")
        assert sorted(os.listdir(cache.root / "objects")) == sorted(wanted[n].sha256 for n in "abd")
    assert cache.used == 3000


async def test_an_object_larger_than_the_cache_is_the_task_s_alone(
    tmp_path: Path, shelf: Shelf
) -> None:
    cache = _cache(tmp_path, limit=1000)
    data = os.urandom(5000)
    for size in (len(data), None):  # known beforehand, or found on arrival
        wanted = shelf.put("big.bin", data)
        async with cache.held(
            Wanted(wanted.sha256, wanted.source, size), shelf.fetch("big.bin")
        ) as held:
            assert held.transient
            workdir = tmp_path / f"task-{size}"
            workdir.mkdir()
            staged_objects.place(held.path, workdir, "big.bin", link=True)
        assert (workdir / "big.bin").read_bytes() == data
        assert (workdir / "big.bin").stat().st_nlink == 1  # no other name left
        assert _listed(cache) == []
    assert shelf.gets == 2


async def test_a_hit_needs_the_source_asked_for(tmp_path: Path, shelf: Shelf) -> None:
    cache = _cache(tmp_path)
    secret = shelf.put("theirs.bin", b"another user's data")
    shelf.put("mine.bin", b"something else")
    claimed = Wanted(secret.sha256, "shelf://mine.bin")
    async with cache.held(secret, shelf.fetch("theirs.bin")):
        pass
    with pytest.raises(ObjectMismatch):
        async with cache.held(claimed, shelf.fetch("mine.bin")):
            pytest.fail("another source's entry is never handed out")
    same = shelf.put("copy.bin", b"another user's data")
    for _ in range(2):  # checked from its own source once, then a hit
        async with cache.held(same, shelf.fetch("copy.bin")) as held:
            assert held.path.read_bytes() == b"another user's data"
    assert (shelf.gets, cache.hits) == (4, 1)


async def test_a_failed_fetch_fails_the_tasks_waiting_on_it(tmp_path: Path, shelf: Shelf) -> None:
    cache = _cache(tmp_path)
    wanted = shelf.put("cut.bin", os.urandom(500_000))
    shelf.cut_after["cut.bin"] = 100_000
    shelf.go.clear()

    async def task() -> None:
        async with cache.held(wanted, shelf.fetch("cut.bin")):
            pass

    running = [asyncio.create_task(task()) for _ in range(5)]
    await asyncio.sleep(0)
    shelf.go.set()
    results = await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 30)
    assert all(isinstance(r, ConnectionResetError) for r in results)
    assert shelf.gets == 1
    assert _listed(cache) == []


def test_placed_as_a_copy_where_jobs_could_write_the_entry(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    entry.write_bytes(b"shared")
    entry.chmod(0o444)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "in.txt").symlink_to(tmp_path / "elsewhere")  # what a job left: replaced
    staged_objects.place(entry, workdir, "in.txt", link=False)
    placed = (workdir / "in.txt").lstat()
    assert placed.st_ino != entry.stat().st_ino
    assert (placed.st_mode & 0o777, (workdir / "in.txt").read_bytes()) == (0o444, b"shared")
    assert not (tmp_path / "elsewhere").exists()
