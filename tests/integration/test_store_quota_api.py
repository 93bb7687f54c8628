"""A user's quota of stored bytes at the api, as strangers' clients meet it: the installed
`vigil` uploading files straight to the real SeaweedFS until the next one would go over, an
operator's `vigil users quota`, and plain HTTP submissions refused (409, naming the bytes used
and the limit) while the user's stored bytes are at their quota."""

import asyncio
import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from shared.objects import ObjectNotFound
from tests.installed_cli import Ran, run_vigil
from tests.integration.object_stores import StoreAt, store_at
from tests.integration.served_api import Served, served_api
from tests.integration.test_api_harness import Caller
from vigil import Client

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
#: What a user's shell holds: the api and a token, no credential of the store.
_NO_STORE_KEYS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_REGION": ""}


def _vigil(served: Served, caller: Caller, *args: str) -> Ran:
    token = caller.headers["Authorization"].removeprefix("Bearer ")
    env = {"VIGIL_URL": served.base_url, "VIGIL_TOKEN": token, "VIGIL_CONFIG": "/dev/null"}
    return run_vigil(list(args), env | _NO_STORE_KEYS)


async def _submit_with(served: Served, tmp_path: Path, big: Path) -> Ran:
    job_file = tmp_path / f"job-{uuid.uuid4().hex[:6]}.yaml"
    job_file.write_text("command: sha256sum big.bin\n")
    return await asyncio.to_thread(
        _vigil, served, served.user, "submit", str(job_file), "--file", str(big), "--json"
    )


async def _user_row(served: Served) -> dict[str, Any]:
    async with served.client(served.operator) as client:
        users = (await client.get("/admin/users")).json()
    return next(u for u in users if u["name"] == served.user.user.name)


async def test_a_user_at_their_quota_is_refused_uploads_and_jobs_with_outputs__named_in_bytes(
    request: pytest.FixtureRequest,
    session_database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: an S3 store and an installation quota of 12 MiB
    store: StoreAt = store_at("s3", request, tmp_path, monkeypatch)
    first, second = tmp_path / "first" / "big.bin", tmp_path / "second" / "big.bin"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(os.urandom(9 * MIB))  # past the 8 MiB a body carries: uploaded
    namespace = f"quota-{uuid.uuid4().hex[:8]}"
    try:
        async with served_api(
            session_database_url, namespace, store_quota_bytes=12 * MIB, **store.settings()
        ) as served:
            # when: the user uploads 9 MiB, then 9 MiB more
            uploaded = await _submit_with(served, tmp_path, first)
            after_first = await _user_row(served)
            refused = await _submit_with(served, tmp_path, second)
            again = await _submit_with(served, tmp_path, first)  # the same bytes: no more
            after_again = await _user_row(served)
            # and: an operator sets their own quota to what they store
            set_quota = await asyncio.to_thread(
                _vigil, served, served.operator, "users", "quota", served.user.user.name, "9MiB"
            )
            async with served.client(served.user) as client:
                with_outputs = await client.post(
                    "/jobs", json={"command": "echo", "outputs": ["out.txt"]}
                )
                without_outputs = await client.post("/jobs", json={"command": "echo"})
            lifted = await asyncio.to_thread(
                _vigil, served, served.operator, "users", "quota", served.user.user.name, "none"
            )
            async with served.client(served.user) as client:
                lifted_outputs = await client.post(
                    "/jobs", json={"command": "echo", "outputs": ["out.txt"]}
                )
    finally:
        await store.store.close()

    # then
    assert uploaded.exit_code == 0, uploaded.stderr
    assert (after_first["stored_bytes"], after_first["quota_bytes"]) == (9 * MIB, 12 * MIB)
    assert after_first["store_quota_bytes"] is None  # the installation's
    assert refused.exit_code != 0
    assert "would go over the quota of stored bytes" in refused.stderr, refused.stderr
    assert f"stores 9 MiB ({9 * MIB} bytes) of a quota of 12 MiB" in refused.stderr
    assert "vigil purge JOB" in refused.stderr  # what to do
    assert again.exit_code == 0, again.stderr
    assert after_again["stored_bytes"] == 9 * MIB  # counted once
    assert set_quota.exit_code == 0, set_quota.stderr
    assert "stores 9 MiB of 9 MiB" in set_quota.stdout
    assert with_outputs.status_code == 409, with_outputs.text
    assert with_outputs.json()["detail"].startswith(
        f"{served.user.user.name} stores 9 MiB ({9 * MIB} bytes) of a quota of 9 MiB"
    )
    assert "purging finished jobs" in with_outputs.json()["next_step"]
    assert without_outputs.status_code == 201, without_outputs.text  # it stores nothing
    assert lifted.exit_code == 0, lifted.stderr
    assert "stores 9 MiB of no quota" in lifted.stdout
    assert lifted_outputs.status_code == 201, lifted_outputs.text


async def test_a_user_deletes_an_upload__its_bytes_leave_the_store_and_their_quota(
    request: pytest.FixtureRequest,
    session_database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store: StoreAt = store_at("s3", request, tmp_path, monkeypatch)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(9 * MIB))
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    namespace = f"quota-{uuid.uuid4().hex[:8]}"
    try:
        async with served_api(session_database_url, namespace, **store.settings()) as served:
            uploaded = await _submit_with(served, tmp_path, big)
            before = await _user_row(served)
            token = served.user.headers["Authorization"].removeprefix("Bearer ")
            with Client(served.base_url, token) as vigil:  # as a script deletes it
                await asyncio.to_thread(vigil.delete_upload, sha)
            async with served.client(served.user) as client:
                again = await client.delete(f"/uploads/{sha}")
                malformed = await client.delete("/uploads/XYZ")
            async with served.client(served.other) as client:
                not_theirs = await client.delete(f"/uploads/{sha}")
            after = await _user_row(served)
        key = f"files/{served.user.user.id}/{sha}"
        with pytest.raises(ObjectNotFound):
            await store.store.head(key)
    finally:
        await store.store.close()

    assert uploaded.exit_code == 0, uploaded.stderr
    assert before["stored_bytes"] == 9 * MIB
    assert after["stored_bytes"] == 0
    assert again.status_code == 404, again.text
    assert again.json()["detail"] == f"you uploaded no file of sha256 {sha}"
    assert not_theirs.status_code == 404, not_theirs.text
    assert malformed.status_code == 422, malformed.text
