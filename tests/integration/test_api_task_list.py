"""`GET /jobs/{id}/tasks` as a queue listing: tasks filtered by one state
or several, and when each ran (`started_at`, `stage_started_at`, `ended_at`, `elapsed_s`)."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _job(api: Api, inputs: int) -> tuple[str, list[str]]:
    """Given-step: a job of `inputs` tasks; (its id, its task ids by index)."""
    job = await api.submit(api.user, inputs=[f"in-{i}" for i in range(inputs)])
    rows = await api.pool.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job["id"])
    return job["id"], [r["id"] for r in rows]


async def _put(api: Api, task_id: str, state: str) -> None:
    await api.pool.execute(
        "UPDATE tasks SET state = $2, claim = NULL WHERE id = $1", task_id, state
    )


async def _attempt(
    api: Api, task_id: str, n: int, stage: str, began_s: float, ended_s: float | None
) -> None:
    """An attempt of the task that began `began_s` seconds ago and ended `ended_s` ago
    (None: it still runs)."""
    await api.pool.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, started_at, ended_at)"
        " VALUES ($1, $2, 1, $3, now() - make_interval(secs => $4),"
        " now() - make_interval(secs => $5))",
        task_id,
        n,
        stage,
        began_s,
        ended_s,
    )


async def _tasks(api: Api, job_id: str, **params: Any) -> Any:
    response = await api.client.get(
        f"/jobs/{job_id}/tasks", params=params, headers=api.user.headers
    )
    assert response.status_code == 200, response.text
    return response


async def test_tasks_are_filtered_by_any_of_the_states_given_page_after_page(api: Api) -> None:
    job_id, ids = await _job(api, 5)
    states = ["completed", "on_cpu", "new", "failed_on_cluster", "on_cpu"]
    for task_id, state in zip(ids, states, strict=True):
        await _put(api, task_id, state)

    both = await _tasks(api, job_id, state=["on_cpu", "failed_on_cluster"])
    first = await _tasks(api, job_id, state=["on_cpu", "failed_on_cluster"], limit=2)

    assert [t["index"] for t in both.json()] == [1, 3, 4]
    assert [t["index"] for t in first.json()] == [1, 3]
    link = first.headers["link"]
    assert link == (
        f'</jobs/{job_id}/tasks?after=3&limit=2&state=failed_on_cluster&state=on_cpu>; rel="next"'
    )
    following = await api.client.get(link[1 : link.index(">")], headers=api.user.headers)
    assert [t["index"] for t in following.json()] == [4]


async def test_a_state_that_is_not_one_is_a_422_naming_it(api: Api) -> None:
    job_id, _ = await _job(api, 1)

    response = await api.client.get(
        f"/jobs/{job_id}/tasks", params={"state": ["on_cpu", "running"]}, headers=api.user.headers
    )

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["query", "state", 1]


async def test_each_task_says_when_it_ran_in_flight_or_at_rest(api: Api) -> None:
    # given: a task that ran and completed, one on a CPU, one queued for a slot, one never run
    job_id, (done, running, queued, fresh) = await _job(api, 4)
    await _put(api, done, "completed")
    await _attempt(api, done, 1, "setup", 100, 95)
    await _attempt(api, done, 2, "cluster", 95, 40)
    await _put(api, running, "on_cpu")
    await _attempt(api, running, 1, "setup", 60, 30)
    await _attempt(api, running, 2, "cluster", 30, None)
    await _put(api, queued, "queued")
    await _attempt(api, queued, 1, "setup", 50, 45)

    # when
    shown = {t["id"]: t for t in (await _tasks(api, job_id)).json()}
    detail = (await api.client.get(f"/tasks/{running}", headers=api.user.headers)).json()

    # then: at rest, first start to last end; in flight, the stage that runs (else since start)
    assert shown[done]["elapsed_s"] == pytest.approx(60, abs=0.5)
    assert shown[done]["ended_at"] is not None and shown[done]["stage_started_at"] is None
    assert shown[running]["elapsed_s"] == pytest.approx(30, abs=5)
    assert shown[running]["stage_started_at"] is not None and shown[running]["ended_at"] is None
    assert shown[queued]["elapsed_s"] == pytest.approx(50, abs=5)
    assert shown[queued]["stage_started_at"] is None
    assert [shown[fresh][k] for k in ("started_at", "elapsed_s")] == [None, None]
    assert detail["stage_started_at"] == shown[running]["stage_started_at"]
