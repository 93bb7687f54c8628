"""The object store's two backends, a directory and the real SeaweedFS, through one interface:
what a put makes visible, write-once keys, resumed reads, listings, deletes, links, and how an
unreachable store fails."""

import asyncio
import contextlib
import hashlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from shared.objects import (
    CHUNK_BYTES,
    ContentChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    open_store,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["directory", "s3"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ObjectStore]:
    if request.param == "directory":
        opened = open_store((tmp_path / "store").as_uri())
    else:
        env: dict[str, str] = request.getfixturevalue("s3_env")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
            monkeypatch.setenv(name, env[name])
        url = f"{env['VIGIL_STORE_URL']}/test-{uuid.uuid4().hex[:10]}"
        opened = open_store(url, endpoint_url=env["VIGIL_S3_ENDPOINT_URL"])
    try:
        yield opened
    finally:
        await opened.close()


def _file(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("size", [0, 1000, 2 * CHUNK_BYTES + 12345])
async def test_a_put_file_reads_back_whole_with_its_sha256(
    store: ObjectStore, tmp_path: Path, size: int
) -> None:
    src = tmp_path / "src"
    digest = _file(src, size)
    info = await store.put_file("outputs/t1/1/result.bin", src)
    assert (info.size, info.sha256) == (size, digest)
    assert await store.head("outputs/t1/1/result.bin") == info
    dest = tmp_path / "dest"
    assert await store.get_file(info.key, dest) == size
    assert dest.read_bytes() == src.read_bytes()
    streamed = b"".join([chunk async for chunk in store.read(info.key)])
    assert streamed == src.read_bytes()


@pytest.mark.parametrize("size", [10, CHUNK_BYTES + 1])
async def test_a_key_is_written_once(store: ObjectStore, tmp_path: Path, size: int) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _file(first, size)
    _file(second, size)
    await store.put_file("once/key", first)
    with pytest.raises(ObjectExists, match="once/key"):
        await store.put_file("once/key", second)
    dest = tmp_path / "dest"
    await store.get_file("once/key", dest)
    assert dest.read_bytes() == first.read_bytes()


@pytest.mark.parametrize("size", [10, 2 * CHUNK_BYTES + 1])
async def test_a_file_that_is_not_the_one_announced_is_not_stored(
    store: ObjectStore, tmp_path: Path, size: int
) -> None:
    src = tmp_path / "src"
    digest = _file(src, size)
    _file(src, size)  # the file changed since its sha256 was taken
    with pytest.raises(ContentChanged):
        await store.put_file("announced/file", src, sha256=digest)
    assert await store.list_prefix("announced") == []
    right = await store.put_file(
        "announced/file", src, sha256=hashlib.sha256(src.read_bytes()).hexdigest()
    )
    assert right.size == size


async def test_a_cut_download_resumes_from_its_offset(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _file(src, CHUNK_BYTES + 5000)
    await store.put_file("resume/big", src)
    dest = tmp_path / "dest"
    # A cut transfer: the first 3000 bytes, then garbage past them that must go.
    dest.write_bytes(src.read_bytes()[:3000] + b"garbage")
    written = await store.get_file("resume/big", dest, offset=3000)
    assert written == CHUNK_BYTES + 2000
    assert dest.read_bytes() == src.read_bytes()
    tail = b"".join([chunk async for chunk in store.read("resume/big", offset=CHUNK_BYTES)])
    assert tail == src.read_bytes()[CHUNK_BYTES:]


async def test_listing_is_by_prefix_and_delete_takes_many(
    store: ObjectStore, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    _file(src, 100)
    for key in ("jobs/a/1/x", "jobs/a/1/y", "jobs/a/2/x", "jobs/ab/1/x"):
        await store.put_file(key, src)
    listed = await store.list_prefix("jobs/a/")
    assert [(info.key, info.size) for info in listed] == [
        ("jobs/a/1/x", 100),
        ("jobs/a/1/y", 100),
        ("jobs/a/2/x", 100),
    ]
    assert await store.list_prefix("jobs/a") == listed  # whole segments: never jobs/ab/
    await store.delete(["jobs/a/1/x", "jobs/a/2/x", "jobs/never/was"])
    assert [info.key for info in await store.list_prefix("jobs/")] == ["jobs/a/1/y", "jobs/ab/1/x"]
    with pytest.raises(ObjectNotFound):
        await store.head("jobs/a/1/x")


async def test_a_missing_object_is_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match="no/such"):
        await store.head("no/such")
    with pytest.raises(ObjectNotFound, match="no/such"):
        await store.get_file("no/such", tmp_path / "dest")
    assert await store.list_prefix("no/") == []


@pytest.mark.parametrize("yields", [1, 3, 20])
async def test_a_cut_put_leaves_nothing_partial(
    store: ObjectStore, tmp_path: Path, yields: int
) -> None:
    src = tmp_path / "src"
    digest = _file(src, 5 * CHUNK_BYTES)
    put = asyncio.create_task(store.put_file("cut/big", src))
    for _ in range(yields):  # cut at different points of the transfer
        await asyncio.sleep(0)
    put.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await put
    # Whatever the point of the cut: no object, or the whole one (it had just been completed).
    listed = await store.list_prefix("cut/")
    assert listed in ([], [ObjectInfo("cut/big", 5 * CHUNK_BYTES)])
    if listed:
        assert (await store.head("cut/big")).sha256 == digest
    else:
        with pytest.raises(ObjectNotFound):
            await store.head("cut/big")


@pytest.mark.parametrize("key", ["../escape", "a/../b", ".meta/x", "a//b", "", "a b"])
async def test_a_key_outside_the_rules_is_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="not a valid object key"):
        await store.head(key)


async def test_a_link_serves_the_object_to_anyone_for_a_while(
    store: ObjectStore, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    _file(src, 4321)
    await store.put_file("linked/file", src)
    url = await store.presigned_get("linked/file", 60)
    if store.url.startswith("file:"):
        assert url is None
        return
    assert url is not None
    async with httpx.AsyncClient() as client:
        response = await client.get(url)
        assert response.status_code == 200
        assert response.content == src.read_bytes()
        forged = await client.get(url.replace("X-Amz-Signature=", "X-Amz-Signature=0"))
        assert forged.status_code == 403


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_store_fails_naming_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    endpoint = f"http://127.0.0.1:{_free_port()}"
    store = open_store("s3://nowhere/p", endpoint_url=endpoint)
    src = tmp_path / "src"
    _file(src, 10)
    with pytest.raises(ObjectStoreError, match=f"s3://nowhere/p at {endpoint}: could not put"):
        await asyncio.wait_for(store.put_file("k", src), 30)
