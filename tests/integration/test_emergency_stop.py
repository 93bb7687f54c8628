"""`POST /admin/emergency-stop` and `POST /admin/resume` on the real database (design §8, §9).

Each test has a database of its own: a stop suspends every job of the installation. Tasks are
put in the state a test needs with plain SQL; the api then stops and resumes, and the answer,
the rows and the outbox are checked.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shared.messaging.topology import supervise_key
from tests.conftest import fresh_database
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration

REASON = "storage array failing <script>alert(1)</script> 'quoted'"


@pytest.fixture
def own_database() -> Iterator[str]:
    with fresh_database("vigil_stop") as url:
        yield url


@pytest.fixture
async def api(own_database: str) -> AsyncIterator[Api]:
    async with running_api(own_database) as running:
        yield running


async def _job(api: Api, caller: Caller, inputs: int = 1) -> tuple[str, list[str]]:
    job = await api.submit(caller, inputs=[f"in-{i}" for i in range(inputs)])
    rows = await api.pool.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job["id"])
    return job["id"], [r["id"] for r in rows]


async def _running(api: Api, task_id: str, host: str = "h-1", pid: int = 4242) -> None:
    """Given-step: the task runs a command (on_cpu, claimed, with an open attempt)."""
    claim = uuid.uuid4()
    await api.pool.execute(
        "UPDATE tasks SET state = 'on_cpu', host = $2, pid = $3, pid_create_time = 1.5,"
        " claim = $4, worker = 'w-1', attempt = 1 WHERE id = $1",
        task_id,
        host,
        pid,
        claim,
    )
    await api.pool.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker, claim, pid)"
        " VALUES ($1, 1, 1, 'cluster', $2, 'w-1', $3, $4)",
        task_id,
        host,
        claim,
        pid,
    )


async def _state(api: Api, table: str, row_id: str) -> str:
    assert table in ("jobs", "tasks")
    return str(await api.pool.fetchval(f"SELECT state FROM {table} WHERE id = $1", row_id))


_TASK_EVENTS = "SELECT count(*) FROM outbox WHERE body->>'task_id' = $1 AND routing_key LIKE $2"


async def _stop(api: Api, reason: str = REASON, caller: Caller | None = None) -> Any:
    caller = caller or api.operator
    return await api.client.post(
        "/admin/emergency-stop", json={"reason": reason}, headers=caller.headers
    )


async def _resume(api: Api, caller: Caller | None = None) -> Any:
    return await api.client.post("/admin/resume", headers=(caller or api.operator).headers)


async def test_when_an_operator_stops__active_jobs_are_suspended_and_running_tasks_killed(
    api: Api,
) -> None:
    # given
    active, (running, waiting) = await _job(api, api.user, inputs=2)
    await _running(api, running, host="h-1", pid=4242)
    held, (held_running,) = await _job(api, api.other)
    await _running(api, held_running, host="h-2", pid=77)
    await api.pool.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", held)

    # when
    response = await _stop(api)

    # then: the answer says who, why and what
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["stopped_by"] == api.operator.user.name
    assert body["reason"] == REASON
    assert (body["jobs_suspended"], body["tasks_killed"]) == (1, 2)
    assert body["resumed_at"] is None
    # jobs: the active one is suspended, the already suspended one stays
    assert await _state(api, "jobs", active) == "suspended"
    assert await _state(api, "jobs", held) == "suspended"
    # tasks: the running ones failed as cancelled, with the brief; the waiting one untouched
    brief = f"emergency stop by {api.operator.user.name}: {REASON}"
    for task_id in (running, held_running):
        row = await api.pool.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
        assert row is not None
        assert row["state"] == "failed_on_cluster"
        assert (row["failure_class"], row["error_brief"]) == ("cancelled", brief)
        assert row["claim"] is None  # the worker's late report is fenced off
        attempt = await api.pool.fetchrow("SELECT * FROM attempts WHERE task_id = $1", task_id)
        assert attempt is not None
        assert attempt["ended_at"] is not None
        assert (attempt["failure_class"], attempt["error_brief"]) == ("cancelled", brief)
    assert await _state(api, "tasks", waiting) == "new"


async def test_when_an_operator_stops__each_killed_task_has_a_kill_for_its_supervisor_and_an_event(
    api: Api,
) -> None:
    # given
    job_id, (task_id,) = await _job(api, api.user)
    await _running(api, task_id, host="h-7", pid=999)

    # when
    response = await _stop(api)

    # then
    assert response.status_code == 202, response.text
    kills = await api.pool.fetch(
        "SELECT routing_key, body FROM outbox WHERE exchange = 'work' AND body->>'task_id' = $1"
        " AND body->>'type' <> 'run_stage'",  # its release at submission
        task_id,
    )
    assert [k["routing_key"] for k in kills] == [supervise_key("h-7")]
    kill = kills[0]["body"]
    assert (kill["type"], kill["pid"], kill["create_time"]) == ("kill_task", 999, 1.5)
    assert kill["reason"].startswith("emergency stop by ")
    events = await api.pool.fetch(
        "SELECT routing_key FROM outbox WHERE exchange = 'events' AND body->>'task_id' = $1"
        " ORDER BY id",
        task_id,
    )
    assert events[-1]["routing_key"] == f"task.failed_on_cluster.{job_id}"


async def test_when_a_stop_is_in_force__a_second_stop_is_refused_with_409_and_changes_nothing(
    api: Api,
) -> None:
    # given
    assert (await _stop(api, "first")).status_code == 202
    stops = await api.pool.fetchval("SELECT count(*) FROM emergency_stops")

    # when
    response = await _stop(api, "second")

    # then
    assert response.status_code == 409
    assert "already in force" in response.json()["detail"]
    assert "first" in response.json()["detail"]
    assert await api.pool.fetchval("SELECT count(*) FROM emergency_stops") == stops


async def test_when_two_stops_race__exactly_one_is_accepted(api: Api) -> None:
    responses = await asyncio.gather(*(_stop(api, f"racer {i}") for i in range(4)))

    assert sorted(r.status_code for r in responses) == [202, 409, 409, 409]
    assert await api.pool.fetchval("SELECT count(*) FROM emergency_stops") == 1


async def test_when_an_operator_resumes__exactly_what_the_stop_did_is_undone(api: Api) -> None:
    # given: two running tasks of an active job, one of a job its owner had suspended
    active, (first, second) = await _job(api, api.user, inputs=2)
    for task_id in (first, second):
        await _running(api, task_id)
    held, (held_task,) = await _job(api, api.other)
    await _running(api, held_task)
    await api.pool.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", held)
    assert (await _stop(api)).status_code == 202
    # and during the stop, the user recovers one killed task themselves
    recover = await api.client.post(
        f"/tasks/{second}/actions", json={"action": "recover"}, headers=api.user.headers
    )
    assert recover.status_code == 202, recover.text

    # when
    response = await _resume(api)

    # then
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["jobs_resumed"] == [active]
    assert sorted(body["tasks_recovered"]) == sorted([first, held_task])
    assert body["stop"]["resumed_by"] == api.operator.user.name
    assert body["stop"]["resumed_at"] is not None
    assert await _state(api, "jobs", active) == "active"
    assert await _state(api, "jobs", held) == "suspended"  # not the stop's to resume
    assert await _state(api, "tasks", first) == "recover_cluster"
    assert await _state(api, "tasks", held_task) == "recover_cluster"  # runs once resumed
    assert await _state(api, "tasks", second) == "recover_cluster"  # by the user, once
    assert await api.pool.fetchval(_TASK_EVENTS, second, "task.recover_cluster.%") == 1


async def test_when_a_job_was_cancelled_during_the_stop__resume_leaves_it_and_its_tasks(
    api: Api,
) -> None:
    # given
    job_id, (task_id,) = await _job(api, api.user)
    await _running(api, task_id)
    assert (await _stop(api)).status_code == 202
    cancel = await api.client.post(
        f"/jobs/{job_id}/actions", json={"action": "cancel"}, headers=api.user.headers
    )
    assert cancel.status_code == 202, cancel.text

    # when
    response = await _resume(api)

    # then
    assert response.status_code == 202, response.text
    assert response.json()["jobs_resumed"] == []
    assert response.json()["tasks_recovered"] == []
    assert await _state(api, "jobs", job_id) == "cancelled"
    assert await _state(api, "tasks", task_id) == "failed_on_cluster"  # not recovered


async def test_when_no_stop_is_in_force__resume_is_refused_with_409(api: Api) -> None:
    first = await _resume(api)
    assert (await _stop(api)).status_code == 202
    assert (await _resume(api)).status_code == 202
    again = await _resume(api)

    for response in (first, again):
        assert response.status_code == 409
        assert response.json() == {
            "detail": "no emergency stop is in force; nothing to resume: work goes on",
            "next_step": "nothing to resume: work goes on",
        }


async def test_when_a_job_is_submitted_during_a_stop__it_is_suspended_until_the_resume(
    api: Api,
) -> None:
    # given
    assert (await _stop(api)).status_code == 202

    # when
    job = await api.submit(api.user)

    # then
    assert job["state"] == "suspended"
    resumed = await _resume(api)
    assert resumed.json()["jobs_resumed"] == [job["id"]]
    assert await _state(api, "jobs", job["id"]) == "active"


async def test_when_a_stop_is_in_force__a_job_cannot_be_resumed_alone(api: Api) -> None:
    # given
    job = await api.submit(api.user)
    assert (await _stop(api)).status_code == 202

    # when
    response = await api.client.post(
        f"/jobs/{job['id']}/actions", json={"action": "resume"}, headers=api.user.headers
    )

    # then
    assert response.status_code == 409
    assert "an emergency stop by" in response.json()["detail"]
    assert REASON in response.json()["detail"]
    assert await _state(api, "jobs", job["id"]) == "suspended"
    assert (await _resume(api)).json()["jobs_resumed"] == [job["id"]]


async def test_when_a_stop_is_in_force__activated_and_reopened_jobs_wait_for_the_resume(
    api: Api,
) -> None:
    # given a configuring job, and a job whose only task failed
    configuring = await api.submit(api.user, configuring=True)
    failed, (task,) = await _job(api, api.user)
    await api.pool.execute("UPDATE tasks SET state = 'failed_to_setup' WHERE id = $1", task)
    await api.pool.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", failed)
    assert (await _stop(api)).status_code == 202

    # when one is activated and the other's task recovered
    activated = await api.client.post(
        f"/jobs/{configuring['id']}/actions", json={"action": "activate"}, headers=api.user.headers
    )
    recovered = await api.client.post(
        f"/tasks/{task}/actions", json={"action": "recover"}, headers=api.user.headers
    )

    # then both jobs are suspended, and belong to the stop
    assert (activated.status_code, activated.json()["state"]) == (202, "suspended")
    assert recovered.status_code == 202, recovered.text
    assert await _state(api, "jobs", failed) == "suspended"
    resumed = (await _resume(api)).json()["jobs_resumed"]
    assert sorted(resumed) == sorted([configuring["id"], failed])


async def test_when_a_user_asks__stop_resume_and_status_are_forbidden(api: Api) -> None:
    stop = await _stop(api, caller=api.user)
    resume = await _resume(api, caller=api.user)
    status = await api.client.get("/admin/emergency-stop", headers=api.user.headers)

    for response in (stop, resume, status):
        assert response.status_code == 403
        assert response.json() == {"detail": "operators only"}
    assert await api.pool.fetchval("SELECT count(*) FROM emergency_stops") == 0


async def test_when_the_status_is_read__it_shows_the_latest_stop_and_whether_it_holds(
    api: Api,
) -> None:
    url, headers = "/admin/emergency-stop", api.operator.headers
    never = (await api.client.get(url, headers=headers)).json()
    await _stop(api, "disk full")
    during = (await api.client.get(url, headers=headers)).json()
    await _resume(api)
    after = (await api.client.get(url, headers=headers)).json()

    assert never == {"in_force": False, "latest": None}
    assert during["in_force"] is True and during["latest"]["reason"] == "disk full"
    assert after["in_force"] is False and after["latest"]["resumed_at"] is not None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({}, "Field required"),
        ({"reason": ""}, "at least 1"),
        ({"reason": "   "}, "must not be blank"),
        ({"reason": "r" * 501}, "at most 500"),
        ({"reason": "a\x00b"}, "pattern"),
        ({"reason": "line\nbreak"}, "pattern"),
        ({"reason": 42}, "valid string"),
        ({"reason": "ok", "force": True}, "Extra inputs"),
    ],
    ids=["missing", "empty", "blank", "too-long", "nul", "newline", "not-text", "extra-field"],
)
async def test_when_the_reason_is_invalid__the_stop_is_refused_with_422(
    api: Api, body: dict[str, Any], words: str
) -> None:
    response = await api.client.post(
        "/admin/emergency-stop", json=body, headers=api.operator.headers
    )

    assert response.status_code == 422, response.text
    assert any(words in e["msg"] for e in response.json()["detail"]), response.json()
    assert await api.pool.fetchval("SELECT count(*) FROM emergency_stops") == 0


async def test_when_the_reason_is_500_characters__it_is_kept_verbatim(api: Api) -> None:
    reason = "é" * 500

    response = await _stop(api, reason)

    assert response.status_code == 202, response.text
    assert await api.pool.fetchval("SELECT reason FROM emergency_stops") == reason
