"""A host's S3 store with no credential: each request on an object is signed for it by the
control plane (`services/scheduler/signer.py`), one object and one task at a time, and sent
over plain HTTP (httpx).

`SignedStore` is the operations of the `ObjectStore` a worker makes for one task it holds:
put its outputs (`put_file`), read what it names (`get_file`, `read`, `head`). It asks a
`Signing` (the signer over AMQP, `shared/messaging/signing.py`) for each link: a signer that
refuses raises `AccessRefused` (final: the task is not held, or the object is not one it
needs); one that does not answer, or a store that fails, `ObjectStoreError` (worth retrying).
Listing and deleting are the control plane's alone: a host's store has none.

A put is as `shared/objects/s3.py`'s: write-once (`If-None-Match: *`) and never partly
visible; a file over `SINGLE_PUT_BYTES` goes as a multipart upload, parts of `CHUNK_BYTES`
(larger for a file of over 10,000 of them) read once, hashed while read, `PART_CONCURRENCY`
in flight; its sha256 is checked before the completion, which alone makes it visible (any
failure aborts it). The sha256 is in the object's signed metadata (`x-amz-meta-sha256`).
"""

import asyncio
import contextlib
import hashlib
import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Protocol
from xml.sax.saxutils import escape

import httpx

from shared.domain.messages import SignOp
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

#: Files up to this size go in one PUT (held in memory); larger ones as multipart uploads.
SINGLE_PUT_BYTES: Final = CHUNK_BYTES
#: Parts of one multipart upload in flight at once.
PART_CONCURRENCY: Final = 4
#: Parts signed per request to the signer (links for about 128 MiB at a time).
PARTS_PER_SIGNING: Final = 16
#: S3's most parts of one upload.
MAX_PARTS: Final = 10_000
#: The metadata header of an object's sha256.
SHA256_HEADER: Final = "x-amz-meta-sha256"


class AccessRefused(ObjectStoreError):
    """The signer refused the request: the task is not held by this host any more, or the
    object is not one it may write or read. Not worth retrying."""


@dataclass(frozen=True)
class Signed:
    """What the signer gave: the links (one; or a multipart upload's parts, in order) and the
    headers the request must carry; for parts, the upload's completion and abort."""

    urls: list[str]
    headers: dict[str, str]
    complete: str | None = None
    abort: str | None = None


class Signing(Protocol):
    """Asks the signer for the link of one request of one task: `op` on `key` (with the
    sha256 the object carries, or the upload and the parts)."""

    async def __call__(
        self,
        op: SignOp,
        key: str,
        *,
        sha256: str | None = None,
        upload_id: str | None = None,
        first_part: int = 1,
        parts: int = 0,
    ) -> Signed: ...


def http_client(request_timeout_s: float = 60) -> httpx.AsyncClient:
    """The HTTP client of a host's signed stores (one per worker: its connections are kept)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(request_timeout_s, connect=5.0),
        limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
    )


class SignedStore:
    """The store at `url` (for messages), each request signed by `signing`, sent by `http`."""

    def __init__(self, url: str, signing: Signing, http: httpx.AsyncClient) -> None:
        self.url = url
        self._sign = signing
        self._http = http

    # -- writing -----------------------------------------------------------------------------

    async def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> ObjectInfo:
        check_key(key)
        size = (await asyncio.to_thread(path.stat)).st_size
        if size <= SINGLE_PUT_BYTES:
            return await self._put_small(key, path, sha256)
        expected = sha256 if sha256 is not None else await asyncio.to_thread(file_sha256, path)
        try:
            await self.head(key)
        except ObjectNotFound:
            pass
        else:
            raise ObjectExists(f"object store {self.url}: {key} is already stored")
        return await _Upload(self, key, path, size, expected).run()

    async def _put_small(self, key: str, path: Path, sha256: str | None) -> ObjectInfo:
        data = await asyncio.to_thread(path.read_bytes)
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and digest != sha256:
            raise ContentChanged(f"{path} is not the file whose sha256 is {sha256}")
        signed = await self._sign("put", key, sha256=digest)
        response = await self._send("put", key, "PUT", signed.urls[0], signed.headers, data)
        if response.status_code == 412:
            raise ObjectExists(f"object store {self.url}: {key} is already stored")
        self._check(response, "put", key)
        return ObjectInfo(key, len(data), digest)

    # -- reading -----------------------------------------------------------------------------

    async def get_file(self, key: str, dest: Path, *, offset: int = 0) -> int:
        return await write_at(dest, offset, self.read(key, offset=offset))

    async def read(self, key: str, *, offset: int = 0) -> AsyncIterator[bytes]:
        check_key(key)
        signed = await self._sign("get", key)
        headers = {**signed.headers, **({"range": f"bytes={offset}-"} if offset else {})}
        request = self._http.build_request("GET", signed.urls[0], headers=headers)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as e:
            raise self._failed("get", key, e) from e
        try:
            if response.status_code == 416 and offset:  # nothing past the offset
                return
            if not response.is_success:
                await response.aread()
            self._check(response, "get", key)
            async for chunk in response.aiter_bytes(CHUNK_BYTES):
                yield chunk
        except httpx.HTTPError as e:
            raise self._failed("get", key, e) from e
        finally:
            await response.aclose()

    async def head(self, key: str) -> ObjectInfo:
        check_key(key)
        signed = await self._sign("head", key)
        response = await self._send("read", key, "HEAD", signed.urls[0], signed.headers)
        self._check(response, "read", key)
        size = int(response.headers.get("content-length", "0"))
        return ObjectInfo(key, size, response.headers.get(SHA256_HEADER))

    # -- what a host does not do ---------------------------------------------------------------

    async def delete(self, keys: Sequence[str]) -> None:
        raise AccessRefused(f"object store {self.url}: a host deletes no object")

    async def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        raise AccessRefused(f"object store {self.url}: a host lists no objects")

    async def presigned_get(self, key: str, expires_s: int) -> str | None:
        return None

    async def presigned_put(self, key: str, expires_s: int) -> str | None:
        return None

    async def close(self) -> None:
        return None  # the HTTP client is the worker's

    # -- HTTP --------------------------------------------------------------------------------

    async def _send(
        self,
        what: str,
        key: str,
        method: str,
        url: str,
        headers: dict[str, str],
        content: bytes | None = None,
    ) -> httpx.Response:
        try:
            return await self._http.request(method, url, headers=headers, content=content)
        except httpx.HTTPError as e:
            raise self._failed(what, key, e) from e

    def _failed(self, what: str, key: str, error: Exception) -> ObjectStoreError:
        brief = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return ObjectStoreError(f"object store {self.url}: could not {what} {key}: {brief}")

    def _check(self, response: httpx.Response, what: str, key: str) -> None:
        """An answer that is not a success as the store's error (a 404 as no such object)."""
        if response.status_code == 404:
            raise ObjectNotFound(f"object store {self.url}: no object {key}")
        if not response.is_success:
            raise ObjectStoreError(
                f"object store {self.url}: could not {what} {key}:"
                f" {response.status_code} {_s3_error(response)}"
            )


class _Upload:
    """One multipart upload of a file: its start, its parts, its completion or its abort."""

    def __init__(self, store: SignedStore, key: str, path: Path, size: int, sha256: str):
        self.store, self.key, self.path, self.size, self.sha256 = store, key, path, size, sha256
        self.part_bytes = max(CHUNK_BYTES, math.ceil(size / MAX_PARTS / (1 << 20)) << 20)
        self.count = max(1, math.ceil(size / self.part_bytes))
        self.upload_id = ""
        self.links: dict[int, str] = {}
        self.headers: dict[str, str] = {}
        self.abort: str | None = None
        self.complete: str | None = None
        self.etags: dict[int, str] = {}
        self._signing = asyncio.Lock()

    async def run(self) -> ObjectInfo:
        store = self.store
        signed = await store._sign("create", self.key, sha256=self.sha256)
        response = await store._send("put", self.key, "POST", signed.urls[0], signed.headers)
        store._check(response, "put", self.key)
        found = re.search(r"<UploadId>([^<]+)</UploadId>", response.text)
        if found is None:
            raise ObjectStoreError(f"object store {store.url}: no upload id for {self.key}")
        self.upload_id = found.group(1)
        try:
            await self._send_parts()
            await self._complete()
        except BaseException:
            await asyncio.shield(self._abort())
            raise
        return ObjectInfo(self.key, self.size, self.sha256)

    async def _send_parts(self) -> None:
        """Read the file in order, hashing it, while `PART_CONCURRENCY` parts are sent."""
        digest = hashlib.sha256()
        read = 0
        room = asyncio.Semaphore(PART_CONCURRENCY)
        sending: set[asyncio.Task[None]] = set()
        f = await asyncio.to_thread(self.path.open, "rb")
        try:
            for number in range(1, self.count + 1):
                await room.acquire()
                chunk = await asyncio.to_thread(_read_hashed, f, self.part_bytes, digest)
                read += len(chunk)
                task = asyncio.create_task(self._part(number, chunk, room))
                sending.add(task)
                task.add_done_callback(sending.discard)
                if any(t.done() and t.exception() for t in list(sending)):
                    break
            extra = await asyncio.to_thread(f.read, 1)
        finally:
            f.close()
            results = await asyncio.gather(*sending, return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        if len(self.etags) != self.count:
            raise ObjectStoreError(f"object store {self.store.url}: a part of {self.key} failed")
        if extra or read != self.size or digest.hexdigest() != self.sha256:
            raise ContentChanged(f"{self.path} changed while it was being stored")

    async def _part(self, number: int, chunk: bytes, room: asyncio.Semaphore) -> None:
        try:
            url = await self._link(number)
            response = await self.store._send("put", self.key, "PUT", url, self.headers, chunk)
            self.store._check(response, "put", self.key)
            self.etags[number] = response.headers.get("etag", "")
        finally:
            room.release()

    async def _link(self, number: int) -> str:
        """Part `number`'s link, signed with the next parts' when it has none yet."""
        async with self._signing:
            if number not in self.links:
                parts = min(PARTS_PER_SIGNING, self.count - number + 1)
                signed = await self.store._sign(
                    "parts", self.key, upload_id=self.upload_id, first_part=number, parts=parts
                )
                self.links.update(zip(range(number, number + parts), signed.urls, strict=True))
                self.headers, self.complete, self.abort = (
                    signed.headers,
                    signed.complete,
                    signed.abort,
                )
            return self.links.pop(number)

    async def _complete(self) -> None:
        if self.complete is None:
            raise ObjectStoreError(f"object store {self.store.url}: no completion for {self.key}")
        body = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{escape(self.etags[n])}</ETag></Part>"
            for n in range(1, self.count + 1)
        )
        xml = f"<CompleteMultipartUpload>{body}</CompleteMultipartUpload>".encode()
        response = await self.store._send("put", self.key, "POST", self.complete, {}, xml)
        self.store._check(response, "put", self.key)
        if b"<Error>" in response.content:  # S3 may answer 200 and fail in the body
            raise ObjectStoreError(
                f"object store {self.store.url}: could not put {self.key}: {_s3_error(response)}"
            )

    async def _abort(self) -> None:
        """Abort the upload (best effort: its parts are never visible either way)."""
        if self.abort is None:
            try:
                signed = await self.store._sign(
                    "parts", self.key, upload_id=self.upload_id, first_part=1, parts=0
                )
            except ObjectStoreError:
                return
            self.abort = signed.abort
        if self.abort is not None:
            with contextlib.suppress(httpx.HTTPError):
                await self.store._http.delete(self.abort)


def _read_hashed(f: BinaryIO, size: int, digest: "hashlib._Hash") -> bytes:
    chunk = f.read(size)
    digest.update(chunk)
    return chunk


def _s3_error(response: httpx.Response) -> str:
    """The store's own words: its error's code and message, else the start of its answer."""
    text = response.text
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    if code is not None:
        return code.group(1) + (f": {message.group(1)}" if message else "")
    return text.strip().splitlines()[0][:200] if text.strip() else response.reason_phrase
