"""Harvest and cleanup through the api on the real database: outputs listed and downloaded,
purge as a job action and what a purged job refuses, retention at submission, bad input.

Outputs are recorded with `outputs_repo.save` (as the worker does) on jobs ended with SQL.
"""

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.objects import keys
from tests.integration import harvest_steps as given
from tests.integration.harvest_steps import HOST
from tests.integration.test_api_harness import Api, running_api
from vigil import AsyncClient, Conflict

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _ended(api: Api, inputs: int = 2, **body: Any) -> tuple[str, list[str]]:
    """Given-step: an ended job of `api.user` with `inputs` tasks that ran on HOST."""
    job = await api.submit(api.user, inputs=[f"in-{i}" for i in range(inputs)], **body)
    async with api.pool.acquire() as conn:
        return job["id"], await given.end(conn, job["id"])


async def _outputs(api: Api, job_id: str, **params: Any) -> Any:
    response = await api.client.get(
        f"/jobs/{job_id}/outputs", params=params, headers=api.user.headers
    )
    assert response.status_code == 200, response.text
    return response.json()


async def _download(api: Api, task_id: str, name: str) -> Any:
    return await api.client.get(f"/tasks/{task_id}/outputs/{name}", headers=api.user.headers)


async def _purge(api: Api, job_id: str) -> Any:
    return await api.client.post(
        f"/jobs/{job_id}/actions", json={"action": "purge"}, headers=api.user.headers
    )


async def test_when_outputs_are_listed__each_task_shows_its_latest_run_in_order(api: Api) -> None:
    job_id, (first, second) = await _ended(api)
    async with api.pool.acquire() as conn:
        await given.record(conn, first, "b.txt", b"old run", store=api.store, run_number=1)
        await given.record(conn, first, "b.txt", b"bb", store=api.store, run_number=2)
        await given.record(conn, first, "a.txt", b"a", store=api.store, run_number=2)
        big = await given.record(conn, second, "big.bin", b"x" * 10, store=api.store, kept=False)
        old = await given.record(conn, second, "old.bin", b"y" * 10, kept=False)

    page = await _outputs(api, job_id)

    listed = [(o["task_id"], o["index"], o["run_number"], o["name"]) for o in page["items"]]
    assert listed == [
        (first, 0, 2, "a.txt"),
        (first, 0, 2, "b.txt"),
        (second, 1, 1, "big.bin"),
        (second, 1, 1, "old.bin"),
    ]
    assert page["next_cursor"] is None
    stored, unstored = page["items"][-2:]
    assert (stored["downloadable"], stored["size"], stored["sha256"]) == (True, 10, big.sha256)
    assert (stored["host"], stored["path"], stored["not_kept"]) == (HOST, big.path, None)
    assert stored["url"] == f"{api.settings.store_url}/{big.object_key}"
    assert (unstored["downloadable"], unstored["sha256"], unstored["url"]) == (
        False,
        old.sha256,
        None,
    )
    assert unstored["not_kept"] == "recorded before outputs were kept in the object store"
    assert page["items"][1]["downloadable"] is True


async def test_when_outputs_are_paged__every_one_comes_once_in_order(api: Api) -> None:
    job_id, task_ids = await _ended(api, inputs=3)
    async with api.pool.acquire() as conn:
        for task_id in task_ids:
            for name in ("x", "y"):
                await given.record(conn, task_id, name, name.encode())

    seen: list[tuple[int, str]] = []
    cursor = None
    while True:
        page = await _outputs(api, job_id, limit=4, **({"cursor": cursor} if cursor else {}))
        seen += [(o["index"], o["name"]) for o in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == [(i, n) for i in range(3) for n in ("x", "y")]


async def test_when_a_task_was_resubmitted__only_its_clone_outputs_are_listed(api: Api) -> None:
    job_id, (old, clone) = await _ended(api)
    async with api.pool.acquire() as conn:
        await given.put(conn, old, superseded_by=clone)
        await given.record(conn, old, "out", b"old")
        await given.record(conn, clone, "out", b"new")

    page = await _outputs(api, job_id)

    assert [o["task_id"] for o in page["items"]] == [clone]


async def test_when_a_stored_output_is_downloaded__its_bytes_come_as_an_attachment(
    api: Api,
) -> None:
    _job_id, (task_id, _) = await _ended(api)
    data = bytes(range(256)) * 8
    async with api.pool.acquire() as conn:
        await given.record(conn, task_id, "résumé data.bin", data, store=api.store, kept=False)

    response = await _download(api, task_id, "résumé data.bin")

    assert response.status_code == 200, response.text
    assert response.content == data
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-length"] == str(len(data))
    assert response.headers["content-disposition"] == (
        "attachment; filename=\"r_sum__data.bin\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20data.bin"
    )
    assert response.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_when_a_download_asks_for_the_rest_from_an_offset__it_gets_those_bytes(
    api: Api,
) -> None:
    _job_id, (task_id, _) = await _ended(api)
    data = bytes(range(256)) * 40
    async with api.pool.acquire() as conn:
        await given.record(conn, task_id, "big.bin", data, store=api.store, kept=False)
    headers = api.user.headers

    rest = await api.client.get(
        f"/tasks/{task_id}/outputs/big.bin", headers=headers | {"Range": "bytes=1000-"}
    )
    past = await api.client.get(
        f"/tasks/{task_id}/outputs/big.bin", headers=headers | {"Range": f"bytes={len(data)}-"}
    )

    assert rest.status_code == 206, rest.text
    assert rest.content == data[1000:]
    assert rest.headers["content-range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    assert past.status_code == 416
    assert past.headers["content-range"] == f"bytes */{len(data)}"


async def test_when_an_output_predates_the_store__the_download_says_so(api: Api) -> None:
    _job_id, (task_id, _) = await _ended(api)
    async with api.pool.acquire() as conn:
        await given.record(conn, task_id, "old.bin", b"x" * 2000, kept=False)
        await given.record(conn, task_id, "kept.txt", b"kept bytes")

    refused = await _download(api, task_id, "old.bin")
    kept = await _download(api, task_id, "kept.txt")

    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        "output old.bin (2000 bytes) was recorded before outputs were kept in the object store,"
        " and its bytes were not kept; run the task's input again in a new job to have it stored"
    )
    assert (kept.status_code, kept.content) == (200, b"kept bytes")


async def test_when_a_stored_object_was_removed_behind_vigil__the_download_says_so(
    api: Api,
) -> None:
    _job_id, (task_id, _) = await _ended(api)
    async with api.pool.acquire() as conn:
        out = await given.record(conn, task_id, "gone.bin", b"z" * 10, store=api.store)
    assert out.object_key is not None
    await api.store.delete([out.object_key])

    response = await _download(api, task_id, "gone.bin")

    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"output gone.bin is recorded under {out.object_key}, which the object store no longer"
        " holds (removed outside Vigil); run the task's input again in a new job"
    )


async def test_when_the_task_recorded_no_such_output__the_download_is_404(api: Api) -> None:
    _job_id, (task_id, _) = await _ended(api)

    response = await _download(api, task_id, "nothing.txt")

    assert response.status_code == 404
    assert response.json()["detail"] == f"task {task_id} recorded no output 'nothing.txt'"


@pytest.mark.parametrize("name", ["%2E%2E", "%01bell", "x" * 256])
async def test_when_the_output_name_is_not_a_plain_file_name__the_download_is_422(
    api: Api, name: str
) -> None:
    _job_id, (task_id, _) = await _ended(api)

    response = await _download(api, task_id, name)

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["path", "name"]
    assert "must be a plain file name" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("cursor", ["garbage!", "WzEsMl0", "eyJhIjoxfQ", "WyIxIiwieCJd"])
async def test_when_the_cursor_is_not_one_of_ours__the_listing_is_422(
    api: Api, cursor: str
) -> None:
    job_id, _ = await _ended(api)

    response = await api.client.get(
        f"/jobs/{job_id}/outputs", params={"cursor": cursor}, headers=api.user.headers
    )

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "cursor"]


async def test_when_a_job_is_purged__logs_and_downloads_are_gone_and_the_job_says_so(
    api: Api,
) -> None:
    job_id, (task_id, _) = await _ended(api)
    async with api.pool.acquire() as conn:
        await given.record(conn, task_id, "out.txt", b"result", store=api.store)
        await given.log_lines(conn, job_id, task_id)
    assert len(await api.store.list_prefix(keys.job_outputs(job_id))) == 1

    response = await _purge(api, job_id)

    assert response.status_code == 202, response.text
    assert response.json()["purged_at"] is not None
    job = (await api.client.get(f"/jobs/{job_id}", headers=api.user.headers)).json()
    assert (job["purged_by"], job["purge_reason"]) == (api.user.user.name, "purge action")
    logs = await api.client.get(f"/jobs/{job_id}/logs", headers=api.user.headers)
    assert logs.json()["items"] == []
    listed = await _outputs(api, job_id)
    assert (listed["items"], listed["next_cursor"]) == ([], None)  # no outputs any more
    assert listed["purged"].startswith(f"job {job_id} was purged at ")
    assert listed["purged"].endswith(" (purge action): its outputs are gone")
    download = await _download(api, task_id, "out.txt")
    assert download.status_code == 409
    assert download.json()["detail"].startswith(f"job {job_id} was purged at ")
    assert await api.store.list_prefix(keys.job_outputs(job_id)) == []  # deleted from the store


async def test_when_a_task_still_runs__the_purge_is_409_naming_it(api: Api) -> None:
    job_id, (_, running) = await _ended(api)
    async with api.pool.acquire() as conn:
        await given.put(conn, running, state="on_cpu")

    response = await _purge(api, job_id)

    assert response.status_code == 409
    assert f"{running} (on_cpu)" in response.json()["detail"]


async def test_when_a_job_was_purged__it_refuses_inputs_actions_and_chaining(api: Api) -> None:
    job_id, (task_id, _) = await _ended(api)
    assert (await _purge(api, job_id)).status_code == 202
    headers = api.user.headers

    refused = [
        await api.client.post(f"/jobs/{job_id}/inputs", json={"inputs": [1]}, headers=headers),
        await api.client.post(
            f"/tasks/{task_id}/actions", json={"action": "duplicate"}, headers=headers
        ),
        await api.client.post(
            f"/jobs/{job_id}/actions", json={"action": "recover_failed"}, headers=headers
        ),
        await api.client.post(
            "/jobs", json={"command": "true", "inputs_from": job_id}, headers=headers
        ),
        await _purge(api, job_id),
    ]

    assert [r.status_code for r in refused] == [409] * 5
    for response in refused:
        assert f"job {job_id} was purged at " in response.json()["detail"]
    assert await api.pool.fetchval("SELECT count(*) FROM tasks WHERE job_id = $1", job_id) == 2


async def test_when_a_job_is_submitted_with_a_retention__it_is_shown(api: Api) -> None:
    job = await api.submit(api.user, retention_s=3600)

    shown = (await api.client.get(f"/jobs/{job['id']}", headers=api.user.headers)).json()

    assert job["retention_s"] == shown["retention_s"] == 3600
    assert shown["purged_at"] is None


@pytest.mark.parametrize(
    ("retention", "says"),
    [
        (59, "the shortest this api accepts is 60 s"),
        (0, "greater than or equal to 1"),
        (-5, "greater than or equal to 1"),
        (10 * 366 * 86400, "less than or equal to"),
        ("soon", "valid number"),
    ],
)
async def test_when_the_retention_is_out_of_bounds__the_submission_is_422(
    api: Api, retention: Any, says: str
) -> None:
    before = await api.jobs_of(api.user)

    response = await api.client.post(
        "/jobs", json={"command": "true", "retention_s": retention}, headers=api.user.headers
    )

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "retention_s"]
    assert says in error["msg"]
    assert await api.jobs_of(api.user) == before


async def test_when_the_client_harvests__it_lists_downloads_and_purges(api: Api) -> None:
    job_id, (first, second) = await _ended(api)
    async with api.pool.acquire() as conn:
        await given.record(conn, first, "out.txt", b"first", store=api.store)
        await given.record(conn, second, "out.txt", b"x" * 5000, kept=False)
    token = api.user.headers["Authorization"].removeprefix("Bearer ")
    client = AsyncClient("http://api", token, http=api.client)

    listed = [(o["task_id"], o["downloadable"]) async for o in client.outputs(job_id, limit=1)]
    data = await client.download(first, "out.txt")
    with pytest.raises(Conflict, match="recorded before outputs were kept in the object store"):
        await client.download(second, "out.txt")
    job = await client.purge(job_id)

    assert listed == [(first, True), (second, False)]
    assert data == b"first"
    assert job["purged_at"] is not None
    with pytest.raises(Conflict, match="was purged at"):
        await client.download(first, "out.txt")
