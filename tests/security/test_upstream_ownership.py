"""Upstream links stay within one owner: an input
`{"upstream_task": "<another user's task>"}` linked that task's outputs into
another user's work dir. Every route that takes inputs answers such an id as it answers an
unknown one (422), and the worker links nothing of another owner's task."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.worker import stage_in
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _a_task_of(api: Api, caller: Caller) -> str:
    job = await api.submit(caller)
    tasks = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=caller.headers)).json()
    return str(tasks[0]["id"])


def _refused_upstream(answer: Any, task_id: str) -> bool:
    return answer.status_code == 422 and any(
        f"task {task_id!r} named in upstream_task does not exist" in error["msg"]
        for error in answer.json()["detail"]
    )


async def test_another_users_task_as_upstream_is_refused_like_an_unknown_one_on_every_route(
    api: Api,
) -> None:
    theirs = await _a_task_of(api, api.other)
    unknown = "t-doesnotexist"
    mine = await api.submit(api.user)
    held = await api.submit(api.user, configuring=True)
    jobs_before = await api.jobs_of(api.user)

    for task_id in (theirs, unknown):
        sneaky = {"upstream_task": task_id}
        answers = [
            await api.client.post(
                "/jobs", json={"command": "ls", "inputs": [sneaky]}, headers=api.user.headers
            ),
            await api.client.post(
                f"/jobs/{mine['id']}/inputs", json={"inputs": [sneaky]}, headers=api.user.headers
            ),
            await api.client.post(
                f"/jobs/{held['id']}/tests", json={"input": sneaky}, headers=api.user.headers
            ),
            await api.client.patch(
                f"/jobs/{held['id']}", json={"inputs": [sneaky]}, headers=api.user.headers
            ),
        ]

        assert [_refused_upstream(a, task_id) for a in answers] == [True] * 4, [
            a.text for a in answers
        ]
    assert await api.jobs_of(api.user) == jobs_before


async def test_a_users_own_task_as_upstream_is_accepted(api: Api) -> None:
    mine = await _a_task_of(api, api.user)

    await api.submit(api.user, inputs=[{"upstream_task": mine}])


async def test_the_worker_links_nothing_of_another_owners_task(api: Api) -> None:
    theirs = await _a_task_of(api, api.other)
    await api.pool.execute(
        "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256)"
        " VALUES ($1, 1, 'secret.txt', '/work/other/secret.txt', 'h-1', 6, 'x')",
        theirs,
    )
    async with api.pool.acquire() as conn:
        as_theirs, theirs_placed = await stage_in.resolve_input(
            conn, {"upstream_task": theirs}, api.other.user.id, Path("/work/j-1/t-1")
        )
        as_mine, mine_placed = await stage_in.resolve_input(
            conn,
            {"upstream_task": theirs, "outputs": {"x": "/etc/passwd"}},
            api.user.user.id,
            Path("/work/j-2/t-2"),
        )

    assert as_theirs["outputs"] == {"secret.txt": "/work/j-1/t-1/secret.txt"}
    assert list(theirs_placed) == ["secret.txt"]
    assert theirs_placed["secret.txt"].path == "/work/other/secret.txt"
    assert as_mine["outputs"] == {}
    assert mine_placed == {}
