"""What every object store of Vigil's does, whatever holds the bytes: the protocol, what it
answers, and its errors. `shared.objects.open_store` makes one from a store URL."""

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Protocol

#: Bytes read or written at a time when a file is streamed to or from a store.
CHUNK_BYTES: Final = 8 << 20

#: One key segment: what a task id, an attempt number, an output's name or a hex digest is made
#: of. No segment starts with a dot, so a store's own bookkeeping (`.meta/`, `.partial/` in a
#: directory store) never collides with a key.
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=+@,-]{0,254}")


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key (relative to the store's root or prefix), its size, and its
    sha256 as recorded when it was put (None for an object that carries none, and in listings)."""

    key: str
    size: int
    sha256: str | None = None


class ObjectStoreError(Exception):
    """The store could not do what was asked: unreachable, refusing, out of space. Worth
    retrying later; `str()` names the store (never its credentials) and the cause."""


class ObjectNotFound(ObjectStoreError):
    """No object has that key."""


class ObjectExists(ObjectStoreError):
    """A write-once put found the key already taken."""


class ContentChanged(ObjectStoreError):
    """The file's bytes changed while it was being put: nothing was stored under the key."""


def check_key(key: str) -> str:
    """`key` if it is a valid object key (slash-separated segments of letters, digits and
    `._=+@,-`, none starting with a dot, at most 1024 characters), else ValueError."""
    if len(key) > 1024 or not all(_SEGMENT.fullmatch(part) for part in key.split("/")):
        raise ValueError(f"not a valid object key: {key!r}")
    return key


def open_at(dest: Path, offset: int) -> BinaryIO:
    """`dest` opened for writing at `offset`, anything past it cut (created when missing)."""
    out = dest.open("r+b" if dest.exists() else "wb")
    out.seek(offset)
    out.truncate()
    return out


async def write_at(dest: Path, offset: int, chunks: AsyncIterator[bytes]) -> int:
    """Write `chunks` into `dest` from `offset` on (`open_at`), each in a thread; the bytes
    written."""
    written = 0
    out = await asyncio.to_thread(open_at, dest, offset)
    try:
        async for chunk in chunks:
            await asyncio.to_thread(out.write, chunk)
            written += len(chunk)
    finally:
        out.close()
    return written


def file_sha256(path: Path) -> str:
    """The sha256 of the file at `path`, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class ObjectStore(Protocol):
    """An object store: write-once keys, atomic puts, ranged reads.

    Keys are relative to the store's root (a directory) or prefix (a bucket's); see `check_key`.
    Every method raises `ObjectStoreError` (or a subclass) when the store fails, never a
    library's own exception.
    """

    #: Where the store is, for messages and logs: the store URL, never a credential.
    url: str

    async def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> ObjectInfo:
        """Store the file at `path` under `key`, once: `ObjectExists` if the key is taken.
        Streams (multipart for a large file), computes the file's sha256 while reading, and
        records it with the object. A put that fails or is cut leaves nothing visible under
        `key`. `sha256`, when the caller has it already, spares a large file's first read:
        the bytes sent must match it. A file whose bytes change meanwhile (or do not match
        `sha256`) raises `ContentChanged`, and nothing is stored."""
        ...

    async def get_file(self, key: str, dest: Path, *, offset: int = 0) -> int:
        """Write the object's bytes from `offset` on into `dest` (created or truncated at
        `offset`, so a cut download resumes where it stopped); return the bytes written."""
        ...

    def read(self, key: str, *, offset: int = 0) -> AsyncIterator[bytes]:
        """The object's bytes from `offset` on, in chunks (`ObjectNotFound` on first read)."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """The object's size and recorded sha256 (`ObjectNotFound` if none)."""
        ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Remove these objects; a key with no object is no error."""
        ...

    async def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        """Every object under `prefix`, by key (sha256 not filled in). The prefix is made of
        whole key segments: `a/b` lists `a/b/c`, never `a/bc`."""
        ...

    async def presigned_get(self, key: str, expires_s: int) -> str | None:
        """A URL that lets anyone GET this object for `expires_s` seconds, or None when the
        store has no such links (a directory: stream `read` instead)."""
        ...

    async def presigned_put(self, key: str, expires_s: int) -> str | None:
        """A URL that lets anyone PUT one object under this key for `expires_s` seconds (a
        client's upload straight to the store, bytes never through Vigil), or None when the
        store has no such links (a directory)."""
        ...

    async def close(self) -> None:
        """Release the store's connections."""
        ...
