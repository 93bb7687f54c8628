"""`POST /jobs/{id}/inputs` and submissions with `inputs_from` (design §6) on the real database."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.store import jobs_repo
from shared.store.jobs_repo import NewJob
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url, max_inputs=5) as running:
        yield running


async def _append(api: Api, job_id: str, body: Any, caller: Caller | None = None) -> Any:
    caller = caller or api.user
    return await api.client.post(f"/jobs/{job_id}/inputs", json=body, headers=caller.headers)


async def _tasks(api: Api, job_id: str) -> list[dict[str, Any]]:
    response = await api.client.get(f"/jobs/{job_id}/tasks", headers=api.user.headers)
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()
    return tasks


async def _keys(api: Api, job_id: str) -> list[str]:
    rows = await api.pool.fetch(
        "SELECT routing_key FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", job_id
    )
    return [r["routing_key"] for r in rows]


def _promised(upstream: dict[str, Any]) -> dict[str, Any]:
    """What a task chained from `upstream` looks like: its input and what it waits for."""
    return {
        "input": {"upstream_task": upstream["id"]},
        "prerequisites": [{"stage": "setup", "task_id": upstream["id"], "required": "completed"}],
    }


# Appending inputs


async def test_when_inputs_are_appended_to_an_active_job__new_tasks_follow_the_last_index(
    api: Api,
) -> None:
    # given
    job = await api.submit(api.user, inputs=["a", "b"])
    before = await _keys(api, job["id"])

    # when
    response = await _append(api, job["id"], {"inputs": ["c", {"n": 4}]})

    # then
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["job"]["id"], body["job"]["state"]) == (job["id"], "active")
    assert body["job"]["counts"] == {"new": 4}
    tasks = await _tasks(api, job["id"])
    assert [(t["index"], t["input"], t["state"]) for t in tasks] == [
        (0, "a", "new"),
        (1, "b", "new"),
        (2, "c", "new"),
        (3, {"n": 4}, "new"),
    ]
    assert body["task_ids"] == [t["id"] for t in tasks[2:]]
    assert (await _keys(api, job["id"]))[len(before) :] == [f"task.new.{job['id']}"] * 2


async def test_when_inputs_are_appended_to_a_completed_job__it_is_active_again(api: Api) -> None:
    # given
    job = await api.submit(api.user, inputs=["a"])
    await api.pool.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", job["id"])
    await api.pool.execute(
        "UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1", job["id"]
    )

    # when
    response = await _append(api, job["id"], {"inputs": ["b"]})

    # then
    assert response.status_code == 201, response.text
    view = response.json()["job"]
    assert (view["state"], view["finished_at"]) == ("active", None)
    assert view["counts"] == {"completed": 1, "new": 1}


async def test_when_inputs_are_appended_to_a_cancelled_job__the_answer_is_409(api: Api) -> None:
    # given
    job = await api.submit(api.user, inputs=["a"])
    cancel = {"action": "cancel"}
    await api.client.post(f"/jobs/{job['id']}/actions", json=cancel, headers=api.user.headers)

    # when
    response = await _append(api, job["id"], {"inputs": ["b"]})

    # then
    assert response.status_code == 409, response.text
    assert "cancelled" in response.json()["detail"]
    assert len(await _tasks(api, job["id"])) == 1


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        pytest.param({"inputs": []}, ["body", "inputs"], "at least 1", id="no-inputs"),
        pytest.param({}, ["body", "inputs"], "Field required", id="missing"),
        pytest.param({"inputs": "a"}, ["body", "inputs"], "valid list", id="not-a-list"),
        pytest.param(
            {"inputs": list(range(6))}, ["body", "inputs"], "at most 5", id="too-many-inputs"
        ),
        pytest.param(
            {"inputs": ["ok", {"a": "\x00"}]}, ["body", "inputs", 1], "NUL", id="nul-in-input"
        ),
        pytest.param(
            {"inputs": ["y" * 65_540]},
            ["body", "inputs", 0],
            "the limit is 65536",
            id="input-too-large",
        ),
        pytest.param(
            {"inputs": ["a"], "command": "x"}, ["body", "command"], "Extra inputs", id="extra"
        ),
    ],
)
async def test_when_appended_inputs_are_invalid__the_answer_is_422_and_no_task_is_made(
    api: Api, body: dict[str, Any], loc: list[Any], words: str
) -> None:
    job = await api.submit(api.user, inputs=["a"])

    response = await _append(api, job["id"], body)

    assert response.status_code == 422, response.text
    assert any(e["loc"] == loc and words in e["msg"] for e in response.json()["detail"])
    assert len(await _tasks(api, job["id"])) == 1


async def test_when_inputs_are_appended_to_another_users_job__the_answer_is_404(
    api: Api,
) -> None:
    job = await api.submit(api.user, inputs=["a"])

    response = await _append(api, job["id"], {"inputs": ["b"]}, caller=api.other)

    assert response.status_code == 404, response.text
    assert len(await _tasks(api, job["id"])) == 1


# Chaining


async def test_when_a_job_takes_its_inputs_from_another__each_task_waits_for_its_upstream_task(
    api: Api,
) -> None:
    # given
    upstream = await api.submit(api.user, inputs=["x", "y"])
    upstream_tasks = await _tasks(api, upstream["id"])

    # when
    job = await api.submit(api.user, inputs_from=upstream["id"])

    # then
    assert (job["inputs_from"], job["counts"]) == (upstream["id"], {"new": 2})
    tasks = await _tasks(api, job["id"])
    assert [t["index"] for t in tasks] == [0, 1]
    assert [{k: t[k] for k in ("input", "prerequisites")} for t in tasks] == [
        _promised(u) for u in upstream_tasks
    ]
    assert await _keys(api, job["id"]) == [f"task.new.{job['id']}"] * 2


async def test_when_a_chained_job_has_prerequisites__its_tasks_wait_for_them_and_upstream(
    api: Api,
) -> None:
    # given
    upstream = await api.submit(api.user, inputs=["x"])
    [up] = await _tasks(api, upstream["id"])
    other = await api.submit(api.user)
    [gate] = await _tasks(api, other["id"])

    # when
    spec = {"post_processing": {gate["id"]: "data_ready"}}
    job = await api.submit(api.user, inputs_from=upstream["id"], prerequisites=spec)

    # then
    [task] = await _tasks(api, job["id"])
    assert task["prerequisites"] == [
        {"stage": "post_processing", "task_id": gate["id"], "required": "data_ready"},
        {"stage": "setup", "task_id": up["id"], "required": "completed"},
    ]
    detail = (await api.client.get(f"/tasks/{task['id']}", headers=api.user.headers)).json()
    assert detail["prerequisites"] == task["prerequisites"]


async def test_when_inputs_are_appended_upstream__the_chained_job_gets_a_task_for_each(
    api: Api,
) -> None:
    # given
    upstream = await api.submit(api.user, inputs=["x", "y"])
    job = await api.submit(api.user, inputs_from=upstream["id"])

    # when
    response = await _append(api, upstream["id"], {"inputs": ["z"]})

    # then
    assert response.status_code == 201, response.text
    [appended] = response.json()["task_ids"]
    tasks = await _tasks(api, job["id"])
    assert [t["index"] for t in tasks] == [0, 1, 2]
    assert {k: tasks[2][k] for k in ("input", "prerequisites")} == _promised({"id": appended})


async def test_when_the_upstream_job_has_no_task_yet__the_chained_job_starts_empty_and_grows(
    api: Api,
) -> None:
    # given: an upstream job with no task (only a chained job can be submitted so)
    async with api.pool.acquire() as conn:
        empty, _ = await jobs_repo.create(conn, api.user.user.id, NewJob("e", "shell", "true", []))

    # when
    job = await api.submit(api.user, inputs_from=empty.id)
    appended = await _append(api, empty.id, {"inputs": ["late"]})

    # then
    assert job["counts"] == {}
    [upstream_task] = appended.json()["task_ids"]
    [task] = await _tasks(api, job["id"])
    assert task["input"] == {"upstream_task": upstream_task}


async def test_when_both_inputs_and_inputs_from_are_given__the_answer_is_422_naming_them(
    api: Api,
) -> None:
    upstream = await api.submit(api.user, inputs=["x"])
    body = {"command": "true", "inputs": ["a"], "inputs_from": upstream["id"]}

    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "inputs_from"]
    assert error["msg"] == "give either inputs or inputs_from, not both"
    assert await api.jobs_of(api.user) == 1


async def test_when_inputs_from_names_another_users_job__the_answer_is_422(api: Api) -> None:
    theirs = await api.submit(api.other, inputs=["x"])
    body = {"command": "true", "inputs_from": theirs["id"]}

    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "inputs_from"]
    assert f"job {theirs['id']!r} named in inputs_from does not exist" == error["msg"]
    assert await api.jobs_of(api.user) == 0


async def test_when_a_chained_submission_is_retried_with_its_key__no_second_chain_is_made(
    api: Api,
) -> None:
    # given
    upstream = await api.submit(api.user, inputs=["x", "y"])
    headers = {**api.user.headers, "Idempotency-Key": "chain-1"}
    body = {"command": "true", "inputs_from": upstream["id"]}
    first = await api.client.post("/jobs", json=body, headers=headers)

    # when
    again = await api.client.post("/jobs", json=body, headers=headers)

    # then
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len(await _tasks(api, first.json()["id"])) == 2


async def test_when_inputs_are_appended_upstream__a_finished_chained_job_is_active_again(
    api: Api,
) -> None:
    # given a chained job that completed
    upstream = await api.submit(api.user, inputs=["a"])
    downstream = await api.submit(api.user, inputs_from=upstream["id"])
    await api.pool.execute(
        "UPDATE tasks SET state = 'completed' WHERE job_id = $1", downstream["id"]
    )
    await api.pool.execute("UPDATE jobs SET state = 'completed' WHERE id = $1", downstream["id"])

    # when an input is appended upstream
    response = await _append(api, upstream["id"], {"inputs": ["b"]})

    # then the chained job has the new promised input to run, and is active again
    assert response.status_code == 201, response.text
    view = (await api.client.get(f"/jobs/{downstream['id']}", headers=api.user.headers)).json()
    assert (view["state"], view["counts"]) == ("active", {"completed": 1, "new": 1})
