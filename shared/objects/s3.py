"""An object store in an S3 bucket (`s3://BUCKET/PREFIX`): AWS, SeaweedFS, MinIO, Ceph RGW.

Spoken with obstore (Rust's `object_store` crate; why this client:
docs/explanation/storage.md). The keys are under PREFIX; the endpoint is
`VIGIL_S3_ENDPOINT_URL` (none: AWS); the credentials are the standard `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` and `AWS_REGION`, read from the environment by obstore.

A put is write-once and never partly visible: a small file goes in one PUT with
`If-None-Match: *` (the store refuses a taken key); a large one as a multipart upload that only
its final CompleteMultipartUpload makes visible (a failed or cut one is aborted, and is never
listed), after a HEAD that finds the key free: Vigil's keys are made unique per writer (one
task attempt), so no two writers race for one. The sha256 is read first, unless the caller gives
it (it goes into the object's metadata, `x-amz-meta-sha256`, which a multipart upload fixes at
its start), and again while uploading: a file whose bytes differ aborts the upload
(`ContentChanged`).
"""

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Final

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotFoundError,
    PreconditionError,
)
from obstore.store import S3Store

from shared.objects.store import (
    CHUNK_BYTES,
    ContentChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    check_key,
    file_sha256,
    write_at,
)

#: The metadata key that holds an object's sha256 (sent as `x-amz-meta-sha256`).
SHA256_META: Final = "sha256"
#: Files up to this size go in one PUT (held in memory); larger ones as multipart uploads.
SINGLE_PUT_BYTES: Final = CHUNK_BYTES
#: Parts of one multipart upload in flight at once.
PART_CONCURRENCY: Final = 4


class S3ObjectStore:
    """Objects in `bucket` under `prefix` (see the module's docstring)."""

    def __init__(
        self, bucket: str, prefix: str, *, endpoint_url: str = "", request_timeout_s: float = 60
    ) -> None:
        self.url = f"s3://{bucket}/{prefix}" + (f" at {endpoint_url}" if endpoint_url else "")
        options: dict[str, object] = {
            "timeout": timedelta(seconds=request_timeout_s),
            "connect_timeout": timedelta(seconds=5),
        }
        if endpoint_url.startswith("http://"):
            options["allow_http"] = True
        config: dict[str, str] = {"endpoint": endpoint_url} if endpoint_url else {}
        self._store = S3Store(
            bucket,
            prefix=prefix or None,
            config=config,  # type: ignore[arg-type]
            client_options=options,  # type: ignore[arg-type]
            # Vigil retries an unreachable store itself, with its own patience: obstore's own
            # retries are kept short so that a failure is reported within seconds.
            retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=10)},
        )

    @contextmanager
    def _translated(self, what: str, key: str) -> Iterator[None]:
        """obstore's and the network's errors as `ObjectStoreError`s naming this store."""
        try:
            yield
        except ObjectStoreError:
            raise
        except (NotFoundError, FileNotFoundError):  # obstore raises the latter for a 404
            raise ObjectNotFound(f"object store {self.url}: no object {key}") from None
        except (AlreadyExistsError, PreconditionError):
            raise ObjectExists(f"object store {self.url}: {key} is already stored") from None
        except (BaseError, OSError, TimeoutError) as e:
            brief = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ObjectStoreError(
                f"object store {self.url}: could not {what} {key}: {brief}"
            ) from e

    async def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> ObjectInfo:
        check_key(key)
        with self._translated("put", key):
            size = (await asyncio.to_thread(path.stat)).st_size
            if size <= SINGLE_PUT_BYTES:
                return await self._put_small(key, path, sha256)
            return await self._put_multipart(key, path, size, sha256)

    async def _put_small(self, key: str, path: Path, sha256: str | None) -> ObjectInfo:
        data = await asyncio.to_thread(path.read_bytes)
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and digest != sha256:
            raise ContentChanged(f"{path} is not the file whose sha256 is {sha256}")
        await obstore.put_async(
            self._store, key, data, mode="create", attributes={SHA256_META: digest}
        )
        return ObjectInfo(key, len(data), digest)

    async def _put_multipart(
        self, key: str, path: Path, size: int, sha256: str | None
    ) -> ObjectInfo:
        expected = sha256 if sha256 is not None else await asyncio.to_thread(file_sha256, path)
        try:
            await obstore.head_async(self._store, key)
        except (NotFoundError, FileNotFoundError):
            pass
        else:
            raise ObjectExists(f"object store {self.url}: {key} is already stored")
        chunks = _checked_chunks(path, expected, size)
        await obstore.put_async(
            self._store,
            key,
            chunks,
            attributes={SHA256_META: expected},
            chunk_size=CHUNK_BYTES,
            max_concurrency=PART_CONCURRENCY,
        )
        return ObjectInfo(key, size, expected)

    async def get_file(self, key: str, dest: Path, *, offset: int = 0) -> int:
        with self._translated("get", key):
            return await write_at(dest, offset, self.read(key, offset=offset))

    async def read(self, key: str, *, offset: int = 0) -> AsyncIterator[bytes]:
        check_key(key)
        with self._translated("get", key):
            options = {"range": {"offset": offset}} if offset else {}
            result = await obstore.get_async(self._store, key, options=options)  # type: ignore[arg-type]
            async for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                yield bytes(chunk)

    async def head(self, key: str) -> ObjectInfo:
        check_key(key)
        with self._translated("read", key):
            result = await obstore.get_async(self._store, key, options={"head": True})
            return ObjectInfo(key, result.meta["size"], result.attributes.get(SHA256_META))

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            check_key(key)
        with self._translated("delete", ", ".join(keys[:3])):
            for start in range(0, len(keys), 1000):
                await obstore.delete_async(self._store, list(keys[start : start + 1000]))

    async def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        with self._translated("list", prefix):
            async for batch in obstore.list(self._store, prefix or None, chunk_size=1000):
                found.extend(ObjectInfo(meta["path"], meta["size"]) for meta in batch)
        return sorted(found, key=lambda info: info.key)

    async def presigned_get(self, key: str, expires_s: int) -> str | None:
        check_key(key)
        with self._translated("sign", key):
            return await obstore.sign_async(self._store, "GET", key, timedelta(seconds=expires_s))

    async def presigned_put(self, key: str, expires_s: int) -> str | None:
        check_key(key)
        with self._translated("sign", key):
            return await obstore.sign_async(self._store, "PUT", key, timedelta(seconds=expires_s))

    async def close(self) -> None:
        return None


async def _checked_chunks(path: Path, expected: str, size: int) -> AsyncIterator[bytes]:
    """The file's bytes in chunks, hashed as they are read; at the end, before the upload is
    completed, a sha256 or size other than the one announced aborts it."""
    digest = hashlib.sha256()
    read = 0
    f = await asyncio.to_thread(path.open, "rb")
    try:
        while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
            await asyncio.to_thread(digest.update, chunk)
            read += len(chunk)
            yield chunk
    finally:
        f.close()
    if read != size or digest.hexdigest() != expected:
        raise ContentChanged(f"{path} changed while it was being stored")
