"""An object store in a local or shared directory (`file:///abs/dir`), the default one.

Layout under the root: `KEY` holds an object's bytes, `.meta/KEY` its sha256, `.partial/` the
files being written. A put copies into `.partial/`, fsyncs, then hard-links the copy to `KEY`,
which fails if the key is taken (write-once) and is atomic (a reader sees the whole object or
none). Keys never start with a dot (`check_key`), so the bookkeeping never shows as an object.
Blocking file work runs in threads.
"""

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import BinaryIO

from shared.objects.store import (
    CHUNK_BYTES,
    ContentChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    check_key,
    open_at,
)

_META = ".meta"
_PARTIAL = ".partial"


class DirectoryStore:
    """Objects as files under `root` (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"a directory store needs an absolute path, not {root}")
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _failed(self, what: str, key: str, error: OSError) -> ObjectStoreError:
        return ObjectStoreError(f"object store {self.url}: {what} {key}: {error}")

    async def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> ObjectInfo:
        target = self._path(key)
        partial = self.root / _PARTIAL / uuid.uuid4().hex
        try:
            if await asyncio.to_thread(target.exists):
                raise ObjectExists(f"object store {self.url}: {key} is already stored")
            # Chunk by chunk, each in a thread: a cancelled put stops between two chunks.
            size, digest = await _copy(path, partial)
            if sha256 is not None and digest != sha256:
                raise ContentChanged(f"{path} is not the file whose sha256 is {sha256}")
            await asyncio.to_thread(self._publish, key, partial, target, digest)
        except OSError as e:
            raise self._failed("could not put", key, e) from e
        finally:
            await asyncio.to_thread(partial.unlink, missing_ok=True)
        return ObjectInfo(key, size, digest)

    def _publish(self, key: str, partial: Path, target: Path, digest: str) -> None:
        """Give the complete copy at `partial` its key: its sha256 first, then its bytes."""
        _write_meta(self.root / _META / key, digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(partial, target)
        except FileExistsError:
            raise ObjectExists(f"object store {self.url}: {key} is already stored") from None
        _fsync_dir(target.parent)

    async def get_file(self, key: str, dest: Path, *, offset: int = 0) -> int:
        source = self._path(key)
        try:
            return await asyncio.to_thread(_copy_range, source, dest, offset)
        except FileNotFoundError:
            raise ObjectNotFound(f"object store {self.url}: no object {key}") from None
        except OSError as e:
            raise self._failed("could not get", key, e) from e

    async def read(self, key: str, *, offset: int = 0) -> AsyncIterator[bytes]:
        source = self._path(key)
        try:
            f = await asyncio.to_thread(source.open, "rb")
        except FileNotFoundError:
            raise ObjectNotFound(f"object store {self.url}: no object {key}") from None
        try:
            f.seek(offset)
            while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
                yield chunk
        finally:
            f.close()

    async def head(self, key: str) -> ObjectInfo:
        source = self._path(key)
        try:
            return await asyncio.to_thread(self._head, key, source)
        except FileNotFoundError:
            raise ObjectNotFound(f"object store {self.url}: no object {key}") from None
        except OSError as e:
            raise self._failed("could not read", key, e) from e

    def _head(self, key: str, source: Path) -> ObjectInfo:
        size = source.stat().st_size
        try:
            digest: str | None = (self.root / _META / key).read_text().strip()
        except FileNotFoundError:
            digest = None
        return ObjectInfo(key, size, digest)

    async def delete(self, keys: Sequence[str]) -> None:
        paths = [self._path(key) for key in keys]
        try:
            await asyncio.to_thread(self._delete, keys, paths)
        except OSError as e:
            raise self._failed("could not delete", ", ".join(keys[:3]), e) from e

    def _delete(self, keys: Sequence[str], paths: Sequence[Path]) -> None:
        for key, path in zip(keys, paths, strict=True):
            path.unlink(missing_ok=True)
            (self.root / _META / key).unlink(missing_ok=True)

    async def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        try:
            return await asyncio.to_thread(self._list_prefix, prefix)
        except OSError as e:
            raise self._failed("could not list", prefix, e) from e

    def _list_prefix(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        start = self.root / check_key(prefix.strip("/")) if prefix.strip("/") else self.root
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if not name.startswith("."):
                    path = Path(dirpath, name)
                    found.append(
                        ObjectInfo(path.relative_to(self.root).as_posix(), path.stat().st_size)
                    )
        return sorted(found, key=lambda info: info.key)

    async def presigned_get(self, key: str, expires_s: int) -> str | None:
        return None

    async def presigned_put(self, key: str, expires_s: int) -> str | None:
        return None

    async def close(self) -> None:
        return None


async def _copy(source: Path, partial: Path) -> tuple[int, str]:
    """Copy `source` to `partial` (flushed to disk), hashing while reading: (size, sha256).
    A source whose size is not what was read at the end changed meanwhile: `ContentChanged`."""
    digest = hashlib.sha256()
    size = 0
    await asyncio.to_thread(partial.parent.mkdir, parents=True, exist_ok=True)
    src = await asyncio.to_thread(source.open, "rb")
    try:
        out = await asyncio.to_thread(partial.open, "xb")
        try:
            while chunk := await asyncio.to_thread(src.read, CHUNK_BYTES):
                await asyncio.to_thread(_hash_and_write, digest, chunk, out)
                size += len(chunk)
            await asyncio.to_thread(_flush, out)
        finally:
            out.close()
        if (await asyncio.to_thread(os.fstat, src.fileno())).st_size != size:
            raise ContentChanged(f"{source} changed while it was being stored")
    finally:
        src.close()
    return size, digest.hexdigest()


def _hash_and_write(digest: "hashlib._Hash", chunk: bytes, out: BinaryIO) -> None:
    digest.update(chunk)
    out.write(chunk)


def _flush(out: BinaryIO) -> None:
    out.flush()
    os.fsync(out.fileno())


def _copy_range(source: Path, dest: Path, offset: int) -> int:
    written = 0
    with source.open("rb") as src, open_at(dest, offset) as out:
        src.seek(offset)
        while chunk := src.read(CHUNK_BYTES):
            out.write(chunk)
            written += len(chunk)
    return written


def _write_meta(path: Path, digest: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    partial.write_text(digest + "\n")
    os.replace(partial, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
