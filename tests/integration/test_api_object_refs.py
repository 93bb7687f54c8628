"""Files and inputs given by reference to objects of the store, at `POST /jobs` and
`POST /jobs/{id}/inputs`, as a client sends them: what is recorded, and every refusal a 422
that names the field and writes nothing (a directory store and the real SeaweedFS)."""

import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.store import quota_repo
from tests.integration.object_stores import KINDS, StoreAt, store_at
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration


@pytest.fixture(params=KINDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[StoreAt]:
    opened = store_at(request.param, request, tmp_path, monkeypatch)
    try:
        yield opened
    finally:
        await opened.store.close()


@pytest.fixture
async def api(session_database_url: str, store: StoreAt) -> AsyncIterator[Api]:
    async with running_api(session_database_url, **store.settings()) as running:
        yield running


async def _put(store: StoreAt, tmp_path: Path, key: str, data: bytes) -> dict[str, str]:
    """An object of the store, as a reference names it."""
    source = tmp_path / uuid.uuid4().hex
    source.write_bytes(data)
    await store.store.put_file(key, source)
    return {"url": store.url_of(key), "sha256": hashlib.sha256(data).hexdigest()}


async def _refused(api: Api, caller: Caller, body: dict[str, Any]) -> list[tuple[Any, str]]:
    """POST /jobs with `body`, asserting a 422 that made no job; (loc, msg) of each error."""
    before = await api.jobs_of(caller)
    response = await api.client.post("/jobs", json=body, headers=caller.headers)
    assert response.status_code == 422, response.text
    assert await api.jobs_of(caller) == before
    return [(tuple(e["loc"]), e["msg"]) for e in response.json()["detail"]]


async def test_a_file_given_by_reference_is_listed_with_its_url_and_stored_size(
    api: Api, store: StoreAt, tmp_path: Path
) -> None:
    ref = await _put(store, tmp_path, "data/genome.fa", b">chr1\nACGT\n" * 1000)
    job = await api.submit(
        api.user,
        files={
            "ref/genome.fa": ref,
            "run.sh": {"content": "ZWNobyBoaQo=", "executable": True},  # echo hi
        },
    )
    assert job["files"] == [
        {"path": "ref/genome.fa", "size": 11000, "sha256": ref["sha256"], "executable": False}
        | {"url": ref["url"]},
        {
            "path": "run.sh",
            "size": 8,
            "sha256": hashlib.sha256(b"echo hi\n").hexdigest(),
            "executable": True,
        },
    ]


async def test_a_reference_the_store_does_not_hold_as_named_refuses_the_submission(
    api: Api, store: StoreAt, tmp_path: Path
) -> None:
    ref = await _put(store, tmp_path, "data/kept.bin", b"what the store holds")
    wrong = hashlib.sha256(b"what the user thinks").hexdigest()
    missing = store.url_of("data/missing.bin")
    errors = await _refused(
        api,
        api.user,
        {
            "command": "true",
            "files": {
                "a.bin": {"url": missing, "sha256": ref["sha256"]},
                "b.bin": {"url": ref["url"], "sha256": wrong},
            },
        },
    )
    assert errors == [
        (("body", "files", "a.bin"), f"no object at {missing}"),
        (
            ("body", "files", "b.bin"),
            f"the object at {ref['url']} has sha256 {ref['sha256']}, not {wrong}",
        ),
    ]


@pytest.mark.parametrize("store", ["directory"], indirect=True)
async def test_references_of_a_bad_form_or_that_the_user_may_not_name_are_refused(
    api: Api, store: StoreAt
) -> None:
    sha = "ab" * 32
    upstream = await api.submit(api.other, command="true")
    refused = {
        "http://example.com/x": "is not an s3:// or file:/// URL",
        "s3://elsewhere/data/x": "is not in the installation's store",
        store.url_of("data/../x"): "no empty, '.' or '..' part",
        store.url_of("data/.hidden"): "not a valid key of the store",
        store.url_of(f"files/{api.other.user.id}/{sha}"): "is another user's upload",
        store.url_of(f"outputs/{upstream['id']}/t/1/out"): "does not exist: its outputs",
    }
    for url, words in refused.items():
        [(loc, msg)] = await _refused(
            api, api.user, {"command": "true", "files": {"x": {"url": url, "sha256": sha}}}
        )
        assert loc[:3] == ("body", "files", "x") and words in msg, (url, msg)
    [(_, msg)] = await _refused(
        api,
        api.user,
        {"command": "true", "files": {"x": {"url": store.url_of("a/b"), "sha256": "ABC"}}},
    )
    assert "is not a sha256" in msg
    mine = store.url_of(f"files/{api.user.user.id}/{sha}")
    for objects, words in [
        ("reads.bam", "must be a map of path to"),
        ({"reads.bam": {"url": mine}}, 'must be {"url": ..., "sha256": ...}'),
        ({"../reads.bam": {"url": mine, "sha256": sha}}, "not a relative path"),
        ({"reads.bam": {"url": "s3://elsewhere/a/b", "sha256": sha}}, "is not in the"),
    ]:
        errors = await _refused(
            api, api.user, {"command": "true", "inputs": [{"objects": objects}]}
        )
        assert len(errors) == 1 and errors[0][0][:3] == ("body", "inputs", 0), errors
        assert words in errors[0][1], errors


@pytest.mark.parametrize("store", ["directory"], indirect=True)
async def test_inputs_that_name_objects_are_appended_when_the_user_may_name_them(
    api: Api, store: StoreAt
) -> None:
    sha = "cd" * 32
    job = await api.submit(api.user, command="true")
    mine = {"objects": {"in/reads.bam": {"url": store.url_of("shared/reads.bam"), "sha256": sha}}}
    theirs = {
        "objects": {"x": {"url": store.url_of(f"files/{api.other.user.id}/{sha}"), "sha256": sha}}
    }
    response = await api.client.post(
        f"/jobs/{job['id']}/inputs", json={"inputs": [mine, theirs]}, headers=api.user.headers
    )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "inputs", 1, "objects", "x"]
    response = await api.client.post(
        f"/jobs/{job['id']}/inputs", json={"inputs": [mine]}, headers=api.user.headers
    )
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("store", ["s3"], indirect=True)
async def test_a_file_uploaded_straight_to_the_store_is_named_by_its_uploader_alone(
    api: Api, store: StoreAt
) -> None:
    data = os.urandom(300_000)
    sha = hashlib.sha256(data).hexdigest()
    body = {"sha256": sha, "size": 5}  # a size that is not the file's: the store's counts
    response = await api.client.post("/uploads", json=body, headers=api.user.headers)
    assert response.status_code == 200, response.text
    upload = response.json()
    assert upload["url"] == store.url_of(f"files/{api.user.user.id}/{sha}")
    async with httpx.AsyncClient() as client:  # as the CLI does: no credential of the store
        put = await client.put(upload["put_url"], content=data)
    assert put.status_code == 200, put.text

    job = await api.submit(api.user, files={"data.bin": {"url": upload["url"], "sha256": sha}})

    assert [(f["path"], f["size"]) for f in job["files"]] == [("data.bin", len(data))]
    async with api.pool.acquire() as conn:
        assert (await quota_repo.of_user(conn, api.user.user.id, 0)).used == len(data)
    [(_, msg)] = await _refused(
        api, api.other, {"command": "true", "files": {"x": {"url": upload["url"], "sha256": sha}}}
    )
    assert "is another user's upload" in msg


@pytest.mark.parametrize("store", ["directory"], indirect=True)
async def test_a_store_without_signed_links_refuses_uploads_saying_what_to_do(api: Api) -> None:
    response = await api.client.post(
        "/uploads", json={"sha256": "ab" * 32, "size": 1}, headers=api.user.headers
    )
    assert response.status_code == 409, response.text
    assert "takes no direct uploads: give the file's bytes" in response.json()["detail"]
    response = await api.client.post(
        "/uploads", json={"sha256": "AB", "size": 1}, headers=api.user.headers
    )
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("store", ["directory"], indirect=True)
async def test_an_output_of_the_users_own_job_is_named_by_its_url(
    api: Api, store: StoreAt, tmp_path: Path
) -> None:
    upstream = await api.submit(api.user, command="true")
    ref = await _put(store, tmp_path, f"outputs/{upstream['id']}/t-x/1/out.bin", b"made")

    job = await api.submit(api.user, files={"in.bin": ref})

    assert [(f["path"], f["url"], f["size"]) for f in job["files"]] == [("in.bin", ref["url"], 4)]
