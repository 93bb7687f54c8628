"""`POST /tasks/{id}/actions` and `POST /jobs/{id}/actions` on the real database (design §2, §9).

Tasks are put in the state a test needs with plain SQL; the api then applies the action
through `shared.operations.task_actions`, and the answer, the row and the outbox are checked.
"""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _job_with_tasks(api: Api, *states: str) -> tuple[str, list[str]]:
    """Given-step: a job of `api.user` with one task per state, forced there with SQL."""
    job = await api.submit(api.user, inputs=[f"in-{i}" for i in range(len(states))])
    ids = [r["id"] for r in await api.pool.fetch(_IDS, job["id"])]
    for task_id, state in zip(ids, states, strict=True):
        await _put(api, task_id, state)
    return job["id"], ids


_IDS = "SELECT id FROM tasks WHERE job_id = $1 ORDER BY index"


async def _put(api: Api, task_id: str, state: str, **columns: Any) -> None:
    columns["state"] = state
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
    await api.pool.execute(f"UPDATE tasks SET {sets} WHERE id = $1", task_id, *columns.values())


async def _set_job_state(api: Api, job_id: str, state: str) -> None:
    await api.pool.execute(
        "UPDATE jobs SET state = $2, finished_at = now() WHERE id = $1", job_id, state
    )


async def _act(api: Api, task_id: str, action: str, caller: Caller | None = None) -> Any:
    caller = caller or api.user
    return await api.client.post(
        f"/tasks/{task_id}/actions", json={"action": action}, headers=caller.headers
    )


async def _act_on_job(api: Api, job_id: str, body: dict[str, Any]) -> Any:
    return await api.client.post(f"/jobs/{job_id}/actions", json=body, headers=api.user.headers)


async def _keys(api: Api, job_id: str) -> list[str]:
    rows = await api.pool.fetch(
        "SELECT routing_key FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", job_id
    )
    return [r["routing_key"] for r in rows]


async def _state(api: Api, table: str, row_id: str) -> str:
    assert table in ("jobs", "tasks")
    return str(await api.pool.fetchval(f"SELECT state FROM {table} WHERE id = $1", row_id))


# Task actions


@pytest.mark.parametrize(
    ("failed", "target"),
    [
        ("failed_setup_prerequisites", "new"),
        ("failed_post_processing_prerequisites", "data_ready"),
        ("failed_to_setup", "recover_setup"),
        ("failed_on_cluster", "recover_cluster"),
        ("failed_to_post_process", "recover_post_processing"),
    ],
)
async def test_when_a_failed_task_is_recovered__it_goes_where_the_recovery_table_says(
    api: Api, failed: str, target: str
) -> None:
    # given
    job_id, [task_id] = await _job_with_tasks(api, failed)

    # when
    response = await _act(api, task_id, "recover")

    # then
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["task"]["id"], body["task"]["state"], body["created"]) == (task_id, target, None)
    assert await _state(api, "tasks", task_id) == target
    assert f"task.{target}.{job_id}" in await _keys(api, job_id)


@pytest.mark.parametrize("action", ["restart_setup", "restart_cluster", "restart_post_processing"])
async def test_when_a_completed_task_is_restarted__it_waits_in_the_restart_state_for_its_hook(
    api: Api, action: str
) -> None:
    job_id, [task_id] = await _job_with_tasks(api, "completed")

    response = await _act(api, task_id, action)

    assert response.status_code == 202, response.text
    assert response.json()["task"]["state"] == action
    assert response.json()["task"]["run_number"] == 1  # goes up only once the hook succeeds
    assert f"task.{action}.{job_id}" in await _keys(api, job_id)


@pytest.mark.parametrize(
    ("state", "action", "allowed"),
    [
        ("new", "restart_cluster", "completed"),
        ("completed", "recover", "failed_on_cluster, failed_post_processing_prerequisites"),
        ("completed", "cancel", "new, on_cpu"),
        ("on_cpu", "duplicate", "completed, failed_on_cluster"),
        ("queued", "hold", "new"),
        ("new", "release", "on_hold"),
    ],
)
async def test_when_the_state_does_not_allow_the_action__the_answer_is_409_naming_both(
    api: Api, state: str, action: str, allowed: str
) -> None:
    # given
    job_id, [task_id] = await _job_with_tasks(api, state)
    before = await _keys(api, job_id)

    # when
    response = await _act(api, task_id, action)

    # then
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert f"cannot {action} a task in state {state};" in detail
    assert allowed in detail
    assert await _state(api, "tasks", task_id) == state
    assert await _keys(api, job_id) == before


async def test_when_a_completed_task_of_a_completed_job_is_duplicated__a_new_task_reopens_it(
    api: Api,
) -> None:
    # given
    job_id, [first, second] = await _job_with_tasks(api, "completed", "completed")
    await _set_job_state(api, job_id, "completed")

    # when
    response = await _act(api, first, "duplicate")

    # then
    assert response.status_code == 202, response.text
    original, created = response.json()["task"], response.json()["created"]
    assert (original["id"], original["state"]) == (first, "completed")
    assert created["id"] not in (first, second)
    assert (created["job_id"], created["index"], created["input"]) == (job_id, 2, "in-0")
    assert (created["state"], created["run_number"], created["attempt"]) == ("new", 1, 0)
    job = (await api.client.get(f"/jobs/{job_id}", headers=api.user.headers)).json()
    assert (job["state"], job["finished_at"]) == ("active", None)
    assert job["counts"] == {"completed": 2, "new": 1}
    assert (await _keys(api, job_id))[-1] == f"task.new.{job_id}"


async def test_when_a_new_task_is_cancelled__it_is_terminated_as_cancelled(api: Api) -> None:
    job_id, [task_id] = await _job_with_tasks(api, "new")

    response = await _act(api, task_id, "cancel")

    assert response.status_code == 202, response.text
    task = response.json()["task"]
    assert (task["state"], task["failure_class"]) == ("terminated", "cancelled")
    assert task["error_brief"] == f"cancelled by {api.user.user.name}"
    assert (await _keys(api, job_id))[-1] == f"task.terminated.{job_id}"


async def test_when_a_running_task_is_cancelled__its_supervisor_gets_a_kill_order(
    api: Api,
) -> None:
    # given
    _job_id, [task_id] = await _job_with_tasks(api, "new")
    await _put(api, task_id, "on_cpu", host="node-3", pid=777, pid_create_time=99.5)

    # when
    response = await _act(api, task_id, "cancel")

    # then
    assert response.status_code == 202, response.text
    work = await api.pool.fetch(
        "SELECT routing_key, body FROM outbox WHERE exchange = 'work' AND body->>'task_id' = $1"
        " AND body->>'type' <> 'run_stage'",  # its release at submission
        task_id,
    )
    assert [(r["routing_key"], r["body"]["type"]) for r in work] == [
        ("supervise.node-3", "kill_task")
    ]
    assert (work[0]["body"]["pid"], work[0]["body"]["create_time"]) == (777, 99.5)
    assert await _state(api, "tasks", task_id) == "terminated"


async def test_when_a_new_task_is_held_then_released__it_is_new_again(api: Api) -> None:
    job_id, [task_id] = await _job_with_tasks(api, "new")

    held = await _act(api, task_id, "hold")
    released = await _act(api, task_id, "release")

    assert (held.status_code, released.status_code) == (202, 202)
    assert (held.json()["task"]["state"], released.json()["task"]["state"]) == ("on_hold", "new")
    assert (await _keys(api, job_id))[-2:] == [f"task.on_hold.{job_id}", f"task.new.{job_id}"]


async def test_when_a_task_of_a_failed_job_is_recovered__the_job_is_active_again(
    api: Api,
) -> None:
    # given
    job_id, [task_id] = await _job_with_tasks(api, "failed_on_cluster")
    await _set_job_state(api, job_id, "failed")

    # when
    response = await _act(api, task_id, "recover")

    # then
    assert response.status_code == 202, response.text
    assert await _state(api, "jobs", job_id) == "active"


async def test_when_another_users_task_is_acted_on__the_answer_is_404_and_nothing_changes(
    api: Api,
) -> None:
    _job_id, [task_id] = await _job_with_tasks(api, "new")

    response = await _act(api, task_id, "cancel", caller=api.other)

    assert response.status_code == 404, response.text
    assert await _state(api, "tasks", task_id) == "new"


async def test_when_an_operator_acts_on_a_users_task__it_is_applied(api: Api) -> None:
    _job_id, [task_id] = await _job_with_tasks(api, "new")

    response = await _act(api, task_id, "hold", caller=api.operator)

    assert response.status_code == 202, response.text
    assert await _state(api, "tasks", task_id) == "on_hold"


async def test_when_the_task_does_not_exist__the_answer_is_404(api: Api) -> None:
    response = await _act(api, "t-missing", "recover")

    assert response.status_code == 404, response.text


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        pytest.param(
            {"action": "reboot"},
            ["body", "action"],
            "'recover', 'restart_setup', 'restart_cluster', 'restart_post_processing',"
            " 'duplicate', 'cancel', 'hold' or 'release'",
            id="unknown-action",
        ),
        pytest.param({}, ["body", "action"], "Field required", id="no-action"),
        pytest.param(
            {"action": "hold", "why": "x"}, ["body", "why"], "Extra inputs", id="extra-field"
        ),
    ],
)
async def test_when_the_task_action_body_is_invalid__the_answer_is_422_naming_the_field(
    api: Api, body: dict[str, Any], loc: list[str], words: str
) -> None:
    _job_id, [task_id] = await _job_with_tasks(api, "new")

    response = await api.client.post(
        f"/tasks/{task_id}/actions", json=body, headers=api.user.headers
    )

    assert response.status_code == 422, response.text
    assert any(e["loc"] == loc and words in e["msg"] for e in response.json()["detail"])
    assert await _state(api, "tasks", task_id) == "new"


# Job actions


async def test_when_a_job_is_suspended_then_resumed__it_is_active_again(api: Api) -> None:
    job_id, _ = await _job_with_tasks(api, "new")

    suspended = await _act_on_job(api, job_id, {"action": "suspend"})
    resumed = await _act_on_job(api, job_id, {"action": "resume"})

    assert (suspended.status_code, resumed.status_code) == (202, 202)
    assert (suspended.json()["state"], resumed.json()["state"]) == ("suspended", "active")


async def test_when_an_active_job_is_resumed__the_answer_is_409_naming_the_states(
    api: Api,
) -> None:
    job_id, _ = await _job_with_tasks(api, "new")

    response = await _act_on_job(api, job_id, {"action": "resume"})

    assert response.status_code == 409, response.text
    assert response.json() == {
        "detail": "cannot resume a job in state active; allowed in: suspended;"
        " it is running already: nothing to resume",
        "next_step": "it is running already: nothing to resume",
    }


async def test_when_a_job_is_cancelled__its_tasks_not_at_rest_end_and_the_event_is_queued(
    api: Api,
) -> None:
    # given
    job_id, ids = await _job_with_tasks(
        api, "new", "on_hold", "queued", "completed", "failed_to_setup"
    )

    # when
    response = await _act_on_job(api, job_id, {"action": "cancel"})

    # then
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["state"] == "cancelled" and job["finished_at"] is not None
    assert job["counts"] == {"terminated": 3, "completed": 1, "failed_to_setup": 1}
    assert [await _state(api, "tasks", t) for t in ids[:3]] == ["terminated"] * 3
    assert (await _keys(api, job_id))[-1] == f"job.cancelled.{job_id}"


async def test_when_a_cancelled_job_is_cancelled_again__the_answer_is_409(api: Api) -> None:
    job_id, _ = await _job_with_tasks(api, "new")
    await _act_on_job(api, job_id, {"action": "cancel"})

    response = await _act_on_job(api, job_id, {"action": "cancel"})

    assert response.status_code == 409, response.text
    assert "in state cancelled" in response.json()["detail"]


async def test_when_the_failed_tasks_of_a_job_are_recovered__each_follows_its_table_row(
    api: Api,
) -> None:
    # given
    job_id, ids = await _job_with_tasks(
        api, "failed_on_cluster", "completed", "failed_setup_prerequisites"
    )
    await _set_job_state(api, job_id, "failed")

    # when
    response = await _act_on_job(api, job_id, {"action": "recover_failed"})

    # then
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "active"
    states = [await _state(api, "tasks", t) for t in ids]
    assert states == ["recover_cluster", "completed", "new"]


async def test_when_no_task_of_the_job_failed__recover_failed_answers_409(api: Api) -> None:
    job_id, _ = await _job_with_tasks(api, "new", "completed")

    response = await _act_on_job(api, job_id, {"action": "recover_failed"})

    assert response.status_code == 409, response.text
    assert response.json()["detail"] == (
        f"job {job_id} has no failed task to recover;"
        f" nothing to do (`vigil status {job_id}` shows its tasks)"
    )


async def test_when_a_job_is_throttled__its_view_shows_the_new_limits(api: Api) -> None:
    job_id, _ = await _job_with_tasks(api, "new")

    both = await _act_on_job(
        api, job_id, {"action": "throttle", "max_in_flight": 4, "release_per_tick": 2}
    )
    one = await _act_on_job(api, job_id, {"action": "throttle", "release_per_tick": 7})

    assert (both.status_code, one.status_code) == (202, 202)
    assert (both.json()["max_in_flight"], both.json()["release_per_tick"]) == (4, 2)
    assert (one.json()["max_in_flight"], one.json()["release_per_tick"]) == (4, 7)
    job = (await api.client.get(f"/jobs/{job_id}", headers=api.user.headers)).json()
    assert (job["max_in_flight"], job["release_per_tick"], job["state"]) == (4, 7, "active")


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        pytest.param(
            {"action": "suspend", "max_in_flight": 3},
            ["body", "max_in_flight"],
            "only accepted with the action throttle",
            id="limit-without-throttle",
        ),
        pytest.param(
            {"action": "cancel", "release_per_tick": 3},
            ["body", "release_per_tick"],
            "only accepted with the action throttle",
            id="rate-without-throttle",
        ),
        pytest.param(
            {"action": "throttle"},
            ["body"],
            "throttle needs max_in_flight and/or release_per_tick",
            id="throttle-without-limits",
        ),
        pytest.param(
            {"action": "throttle", "max_in_flight": 0},
            ["body", "max_in_flight"],
            "greater than or equal to 1",
            id="limit-zero",
        ),
        pytest.param(
            {"action": "throttle", "release_per_tick": 100_001},
            ["body", "release_per_tick"],
            "less than or equal to 100000",
            id="rate-too-high",
        ),
        pytest.param(
            {"action": "pause"},
            ["body", "action"],
            "'cancel', 'suspend', 'resume', 'recover_failed', 'throttle', 'activate' or 'purge'",
            id="unknown-action",
        ),
        pytest.param(
            {"action": "suspend", "force": True}, ["body", "force"], "Extra inputs", id="extra"
        ),
    ],
)
async def test_when_the_job_action_body_is_invalid__the_answer_is_422_naming_the_field(
    api: Api, body: dict[str, Any], loc: list[str], words: str
) -> None:
    job_id, _ = await _job_with_tasks(api, "new")

    response = await _act_on_job(api, job_id, body)

    assert response.status_code == 422, response.text
    assert any(e["loc"] == loc and words in e["msg"] for e in response.json()["detail"])
    assert await _state(api, "jobs", job_id) == "active"


async def test_when_another_users_job_is_acted_on__the_answer_is_404_and_nothing_changes(
    api: Api,
) -> None:
    job_id, _ = await _job_with_tasks(api, "new")

    response = await api.client.post(
        f"/jobs/{job_id}/actions", json={"action": "cancel"}, headers=api.other.headers
    )

    assert response.status_code == 404, response.text
    assert await _state(api, "jobs", job_id) == "active"
