"""The api's job and task routes on the real database: submit, read, list, isolation, auth."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def test_when_a_job_is_submitted__it_has_one_new_task_per_input_and_their_events(
    api: Api,
) -> None:
    # when
    response = await api.client.post(
        "/jobs",
        json={"name": "sweep", "command": "echo $VIGIL_INPUT", "inputs": ["a", {"n": 2}, 3]},
        headers=api.user.headers,
    )

    # then
    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["location"] == f"/jobs/{job['id']}"
    assert (job["name"], job["type"], job["state"]) == ("sweep", "shell", "active")
    assert job["counts"] == {"new": 3}
    assert job["owner_id"] == api.user.user.id
    assert job["policy"]["max_infra_retries"] == 3
    tasks = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()
    assert [(t["index"], t["input"], t["state"]) for t in tasks] == [
        (0, "a", "new"),
        (1, {"n": 2}, "new"),
        (2, 3, "new"),
    ]
    keys = await api.pool.fetch(
        "SELECT exchange, routing_key FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", job["id"]
    )
    events = [r["routing_key"] for r in keys if r["exchange"] == "events"]
    assert events == [f"task.new.{job['id']}"] * 3
    # and none is placed by the submission: the scheduler's planning round places them by the
    # pool's free capacity
    assert [r["exchange"] for r in keys] == ["events"] * 3


async def test_when_no_inputs_are_given__the_job_has_one_task_with_an_empty_input(
    api: Api,
) -> None:
    job = await api.submit(api.user)

    tasks = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()
    assert [t["input"] for t in tasks] == [""]


async def test_when_a_job_of_a_type_other_than_shell_has_no_command__it_is_accepted(
    api: Api,
) -> None:
    body = {"type": "diagnostics", "params": {"cluster_delay": 0.5}}

    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    assert response.status_code == 201, response.text
    assert (response.json()["command"], response.json()["params"]) == ("", {"cluster_delay": 0.5})


async def test_when_a_submission_is_retried_with_its_idempotency_key__the_same_job_comes_back(
    api: Api,
) -> None:
    # given
    headers = {**api.user.headers, "Idempotency-Key": "submit-42"}
    first = await api.client.post("/jobs", json={"command": "true"}, headers=headers)

    # when
    again = await api.client.post("/jobs", json={"command": "true"}, headers=headers)

    # then
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["counts"] == {"new": 1}
    assert await api.jobs_of(api.user) == 1


async def test_when_two_users_use_the_same_idempotency_key__each_gets_a_job_of_their_own(
    api: Api,
) -> None:
    key = {"Idempotency-Key": "same-key"}
    mine = await api.client.post("/jobs", json={"command": "true"}, headers=api.user.headers | key)
    theirs = await api.client.post(
        "/jobs", json={"command": "true"}, headers=api.other.headers | key
    )

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["no-token", "unknown-token", "not-bearer"],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/jobs"), ("GET", "/jobs"), ("GET", "/jobs/j-x"), ("GET", "/tasks/t-x")],
)
async def test_when_the_token_is_missing_or_bad__the_answer_is_401_with_a_bearer_challenge(
    api: Api, headers: dict[str, str], method: str, path: str
) -> None:
    response = await api.client.request(method, path, json={"command": "true"}, headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"detail": "missing or invalid bearer token"}
    assert await api.jobs_of(api.user) == 0


async def test_when_a_user_asks_for_another_users_job__every_route_answers_404(api: Api) -> None:
    # given
    job = await api.submit(api.user)
    tasks = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()

    # when
    paths = [f"/jobs/{job['id']}", f"/jobs/{job['id']}/tasks", f"/jobs/{job['id']}/logs"]
    paths.append(f"/tasks/{tasks[0]['id']}")
    answers = [await api.client.get(path, headers=api.other.headers) for path in paths]

    # then
    assert [a.status_code for a in answers] == [404] * 4
    assert answers[0].json() == {"detail": f"job {job['id']!r} not found"}
    assert answers[3].json() == {"detail": f"task {tasks[0]['id']!r} not found"}


async def test_when_an_operator_reads_a_users_job__it_is_shown(api: Api) -> None:
    job = await api.submit(api.user)

    response = await api.client.get(f"/jobs/{job['id']}", headers=api.operator.headers)

    assert response.status_code == 200
    # a read also says why the job waits (this api's pool has no worker; its task waits for
    # the scheduler's round); a submission does not
    shown = response.json()
    assert shown.pop("waiting_on") == "no worker of pool default has a fresh heartbeat"
    assert shown.pop("waiting") == {
        "reason": "pending",
        "message": "waiting for the scheduler's next round",
        "detail": {},
        "tasks": 1,
    }
    assert job.pop("waiting_on") is None
    assert job.pop("waiting") is None
    assert job.pop("warnings") == []  # what the submitter is told, once
    assert shown == job


async def test_when_a_job_does_not_exist__the_answer_is_404(api: Api) -> None:
    response = await api.client.get("/jobs/j-doesnotexist", headers=api.operator.headers)

    assert response.status_code == 404
    assert response.json() == {"detail": "job 'j-doesnotexist' not found"}


async def test_when_listing_jobs_page_by_page__each_job_comes_once_newest_first(api: Api) -> None:
    # given
    made = [(await api.submit(api.user, name="paged"))["id"] for _ in range(5)]
    await api.submit(api.user, name="other-name")

    # when
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"name": "paged", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await api.client.get("/jobs", params=params, headers=api.user.headers)).json()
        seen += [job["id"] for job in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break

    # then
    assert seen == list(reversed(made))
    assert pages == 3
    assert all(job["counts"] == {"new": 1} for job in page["items"])


async def test_when_a_user_lists_jobs__only_their_own_come_and_an_operator_sees_all(
    api: Api,
) -> None:
    mine = await api.submit(api.user)
    theirs = await api.submit(api.other)

    listed_by_user = await api.client.get("/jobs", headers=api.user.headers)
    listed_by_operator = await api.client.get(
        "/jobs", params={"limit": 500}, headers=api.operator.headers
    )

    assert [job["id"] for job in listed_by_user.json()["items"]] == [mine["id"]]
    operator_ids = {job["id"] for job in listed_by_operator.json()["items"]}
    assert {mine["id"], theirs["id"]} <= operator_ids


async def test_when_listing_jobs_by_state__only_jobs_in_that_state_come(api: Api) -> None:
    job = await api.submit(api.user)

    active = await api.client.get("/jobs", params={"state": "active"}, headers=api.user.headers)
    done = await api.client.get("/jobs", params={"state": "completed"}, headers=api.user.headers)

    assert [j["id"] for j in active.json()["items"]] == [job["id"]]
    assert done.json() == {"items": [], "next_cursor": None}


async def test_when_reading_a_new_task__it_has_no_attempts_and_its_job_fields(api: Api) -> None:
    job = await api.submit(api.user, inputs=["x"])
    tasks = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()

    response = await api.client.get(f"/tasks/{tasks[0]['id']}", headers=api.user.headers)

    assert response.status_code == 200
    task = response.json()
    assert task["attempts"] == []
    assert task["prerequisites"] == []
    assert (task["job_id"], task["index"], task["input"]) == (job["id"], 0, "x")
    assert (task["state"], task["run_number"], task["attempt"]) == ("new", 1, 0)
    assert task["failure_class"] is None and task["superseded_by"] is None


async def test_when_a_job_has_prerequisites__every_task_waits_for_them(api: Api) -> None:
    # given
    first = await api.submit(api.user)
    first_tasks = await api.client.get(f"/jobs/{first['id']}/tasks", headers=api.user.headers)
    upstream = first_tasks.json()[0]["id"]
    spec = {"setup": {upstream: "completed"}, "post_processing": {upstream: "data_ready"}}

    # when
    job = await api.submit(api.user, inputs=[1, 2], prerequisites=spec)

    # then
    assert job["prerequisites"] == spec
    tasks = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()
    expected = [
        {"stage": "post_processing", "task_id": upstream, "required": "data_ready"},
        {"stage": "setup", "task_id": upstream, "required": "completed"},
    ]
    assert [t["prerequisites"] for t in tasks] == [expected, expected]


async def test_when_an_operator_names_another_users_task_as_prerequisite__it_is_accepted(
    api: Api,
) -> None:
    theirs = await api.submit(api.user)
    tasks = await api.client.get(f"/jobs/{theirs['id']}/tasks", headers=api.user.headers)

    job = await api.submit(api.operator, prerequisites={"setup": {tasks.json()[0]["id"]: "failed"}})

    assert job["prerequisites"] == {"setup": {tasks.json()[0]["id"]: "failed"}}


async def test_a_jobs_tasks_come_a_page_at_a_time_each_page_saying_where_the_next_starts(
    api: Api,
) -> None:
    body = {"name": "paged", "command": "true", "inputs": [str(i) for i in range(5)]}
    job = (await api.client.post("/jobs", json=body, headers=api.user.headers)).json()
    url = f"/jobs/{job['id']}/tasks"

    first = await api.client.get(url, params={"limit": 2}, headers=api.user.headers)
    second = await api.client.get(url, params={"limit": 2, "after": 1}, headers=api.user.headers)
    last = await api.client.get(url, params={"limit": 2, "after": 3}, headers=api.user.headers)
    followed = await api.client.get(first.links["next"]["url"], headers=api.user.headers)

    assert [t["index"] for t in first.json()] == [0, 1]
    assert first.links["next"]["url"] == f"{url}?after=1&limit=2"
    assert [t["index"] for t in second.json()] == [2, 3]
    assert [t["index"] for t in last.json()] == [4]
    assert "link" not in last.headers  # a short page is the last
    assert followed.json() == second.json()


async def test_a_jobs_tasks_can_be_read_in_one_state_only(api: Api) -> None:
    body = {"name": "states", "command": "true", "inputs": ["a", "b", "c"]}
    job = (await api.client.post("/jobs", json=body, headers=api.user.headers)).json()
    await api.pool.execute(
        "UPDATE tasks SET state = 'completed' WHERE job_id = $1 AND index = 1", job["id"]
    )
    url = f"/jobs/{job['id']}/tasks"

    done = await api.client.get(url, params={"state": "completed"}, headers=api.user.headers)
    bad = await api.client.get(url, params={"state": "nonsense"}, headers=api.user.headers)

    assert [t["index"] for t in done.json()] == [1]
    assert bad.status_code == 422


async def test_throttles_given_at_submission_are_the_jobs_and_checked_like_the_action(
    api: Api,
) -> None:
    job = await api.submit(api.user, max_in_flight=1, release_per_tick=3)
    refused = await api.client.post(
        "/jobs", json={"command": "true", "max_in_flight": 0}, headers=api.user.headers
    )

    assert (job["max_in_flight"], job["release_per_tick"]) == (1, 3)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "max_in_flight"]


async def test_when_bash_cannot_parse_the_command__the_job_is_accepted_with_a_warning(
    api: Api, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    broken = f'touch {ran}; echo "unterminated'

    response = await api.client.post(
        "/jobs", json={"command": broken, "inputs": ["a"]}, headers=api.user.headers
    )
    again = await api.client.post(
        "/jobs", json={"command": broken, "inputs": ["b"]}, headers=api.user.headers
    )

    assert response.status_code == 201, response.text
    [warning] = response.json()["warnings"]
    assert warning.startswith("command: bash cannot parse it (`bash -n`): bash: line 1:")
    assert "unexpected EOF while looking for matching" in warning
    assert "every task would fail with exit code 2" in warning
    assert again.json()["warnings"] == [warning]  # remembered, the same
    assert not ran.exists()  # parsed, never run


@pytest.mark.parametrize(
    ("body", "warned"),
    [
        ({"command": "echo $VIGIL_INPUT | tr a-z A-Z"}, False),
        ({"command": "if true; then\n  echo yes\nfi"}, False),
        ({"command": "echo )"}, True),
        ({"type": "diagnostics", "command": 'echo "unterminated'}, False),  # not bash's
    ],
)
async def test_only_a_shell_command_bash_cannot_parse_is_warned_of(
    api: Api, body: dict[str, Any], warned: bool
) -> None:
    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    assert response.status_code == 201, response.text
    assert bool(response.json()["warnings"]) is warned
