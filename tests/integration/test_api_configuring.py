"""Try before production: configuring jobs, test tasks, edits and activation, through
the in-process api on the real database."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.integration.test_api_harness import Api, Caller, running_api
from tests.integration.waiting import until_someone_blocked

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url, max_inputs=5) as running:
        yield running


async def _configuring(api: Api, **body: Any) -> dict[str, Any]:
    return await api.submit(api.user, configuring=True, **body)


async def _tasks(api: Api, job_id: str) -> list[dict[str, Any]]:
    response = await api.client.get(f"/jobs/{job_id}/tasks", headers=api.user.headers)
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()
    return tasks


async def _test(api: Api, job_id: str, body: Any, caller: Caller | None = None) -> Any:
    headers = (caller or api.user).headers
    return await api.client.post(f"/jobs/{job_id}/tests", json=body, headers=headers)


async def _act(api: Api, job_id: str, action: str) -> Any:
    return await api.client.post(
        f"/jobs/{job_id}/actions", json={"action": action}, headers=api.user.headers
    )


async def _edit(api: Api, job_id: str, body: Any, caller: Caller | None = None) -> Any:
    headers = (caller or api.user).headers
    return await api.client.patch(f"/jobs/{job_id}", json=body, headers=headers)


async def _routing_keys(api: Api, job_id: str) -> list[str]:
    rows = await api.pool.fetch(
        "SELECT routing_key FROM outbox WHERE body->>'job_id' = $1 ORDER BY id", job_id
    )
    return [r["routing_key"] for r in rows]


async def test_a_configuring_job_holds_its_inputs_and_has_no_task(api: Api) -> None:
    job = await _configuring(api, inputs=["a", "b", "c"])

    assert job["state"] == "configuring"
    assert (job["counts"], job["test_counts"], job["held_inputs"]) == ({}, {}, 3)
    assert await _tasks(api, job["id"]) == []


async def test_a_test_runs_one_held_input_as_a_test_task_with_a_negative_index(api: Api) -> None:
    job = await _configuring(api, inputs=["a", "b", "c"])

    first = await _test(api, job["id"], {"input_index": 2})
    second = await _test(api, job["id"], {"input": {"seed": 7}})
    third = await _test(api, job["id"], {})

    assert [r.status_code for r in (first, second, third)] == [201, 201, 201]
    made = [
        (r.json()["index"], r.json()["input"], r.json()["test"]) for r in (first, second, third)
    ]
    assert made == [(-1, "c", True), (-2, {"seed": 7}, True), (-3, "a", True)]
    view = (await api.client.get(f"/jobs/{job['id']}", headers=api.user.headers)).json()
    assert (view["counts"], view["test_counts"]) == ({}, {"new": 3})


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"input_index": 3}, 409, "holds 3 input(s); give input_index 0 to 2"),
        ({"input_index": -1}, 422, "greater than or equal to 0"),
        ({"input_index": 0, "input": "x"}, 422, "either input_index or input"),
        ({"inputs": ["x"]}, 422, "Extra inputs are not permitted"),
    ],
)
async def test_a_bad_test_request_is_refused_with_the_reason(
    api: Api, body: Any, status: int, says: str
) -> None:
    job = await _configuring(api, inputs=["a", "b", "c"])

    response = await _test(api, job["id"], body)

    assert response.status_code == status, response.text
    assert says in response.text
    assert await _tasks(api, job["id"]) == []


async def test_an_active_job_runs_no_test(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a"])

    response = await _test(api, job["id"], {})

    assert response.status_code == 409
    assert "only a configuring job" in response.json()["detail"]


async def test_another_users_job_cannot_be_tested_edited_or_activated(api: Api) -> None:
    job = await _configuring(api, inputs=["a"])

    refused = [
        await _test(api, job["id"], {}, api.other),
        await _edit(api, job["id"], {"command": "rm -rf /"}, api.other),
        await api.client.post(
            f"/jobs/{job['id']}/actions", json={"action": "activate"}, headers=api.other.headers
        ),
    ]

    assert [r.status_code for r in refused] == [404, 404, 404]
    command = await api.pool.fetchval("SELECT command FROM jobs WHERE id = $1", job["id"])
    assert command == "echo hello"


async def test_activation_makes_the_tasks_from_the_held_inputs_and_discards_the_tests(
    api: Api,
) -> None:
    # given a configuring job with a finished test (with an output) and a running one
    job = await _configuring(api, inputs=["a", "b"])
    done = (await _test(api, job["id"], {})).json()
    running = (await _test(api, job["id"], {"input_index": 1})).json()
    await api.pool.execute(
        "UPDATE tasks SET state = 'completed', host = 'h1', workdir = '/w/x' WHERE id = $1",
        done["id"],
    )
    await api.pool.execute(
        "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256)"
        " VALUES ($1, 1, 'out.txt', '/w/x/out.txt', 'h1', 3, 'abc')",
        done["id"],
    )
    await api.pool.execute(
        "UPDATE tasks SET state = 'setting_up', claim = gen_random_uuid() WHERE id = $1",
        running["id"],
    )

    # when
    response = await _act(api, job["id"], "activate")

    # then the job is active with one task per held input, the tests are a record
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["state"], body["held_inputs"], body["counts"]) == ("active", None, {"new": 2})
    assert body["test_counts"] == {"completed": 1, "terminated": 1}
    assert body["activated_at"] is not None
    tasks = await _tasks(api, job["id"])
    assert [(t["index"], t["input"], t["test"]) for t in tasks if not t["test"]] == [
        (0, "a", False),
        (1, "b", False),
    ]
    outputs = await api.pool.fetchval(
        "SELECT count(*) FROM task_outputs WHERE task_id = $1", done["id"]
    )
    assert outputs == 0
    work = await api.pool.fetch(
        "SELECT routing_key, body FROM outbox WHERE exchange = 'work' AND body->>'job_id' = $1",
        job["id"],
    )
    removals = [r for r in work if r["body"]["type"] == "remove_workdirs"]
    assert [(r["routing_key"].rsplit(".", 1)[-1], r["body"]["task_ids"]) for r in removals] == [
        ("h1", [done["id"]])
    ]
    assert f"job.activated.{job['id']}" in await _routing_keys(api, job["id"])


async def test_a_test_task_of_an_active_job_cannot_be_acted_on(api: Api) -> None:
    job = await _configuring(api, inputs=["a"])
    test = (await _test(api, job["id"], {})).json()
    await api.pool.execute("UPDATE tasks SET state = 'failed_on_cluster' WHERE id = $1", test["id"])
    assert (await _act(api, job["id"], "activate")).status_code == 202

    response = await api.client.post(
        f"/tasks/{test['id']}/actions", json={"action": "recover"}, headers=api.user.headers
    )
    recover_failed = await _act(api, job["id"], "recover_failed")

    assert response.status_code == 409
    assert "test run" in response.json()["detail"]
    assert recover_failed.status_code == 409
    assert "no failed task" in recover_failed.json()["detail"]


async def test_a_second_activation_is_refused(api: Api) -> None:
    job = await _configuring(api, inputs=["a"])
    assert (await _act(api, job["id"], "activate")).status_code == 202

    again = await _act(api, job["id"], "activate")

    assert again.status_code == 409
    assert "it is active" in again.json()["detail"]
    assert len(await _tasks(api, job["id"])) == 1


async def test_a_configuring_job_can_be_edited_and_the_edit_is_recorded(api: Api) -> None:
    job = await _configuring(api, inputs=["a"], policy={"max_app_retries": 1})

    response = await _edit(
        api,
        job["id"],
        {
            "command": "echo fixed $VIGIL_INPUT",
            "inputs": ["x", "y", "z"],
            "outputs": ["result.txt"],
            "policy": {"walltime": 60},
        },
    )

    assert response.status_code == 200, response.text
    view = response.json()
    assert view["command"] == "echo fixed $VIGIL_INPUT"
    assert (view["held_inputs"], view["outputs"]) == (3, ["result.txt"])
    assert (view["policy"]["walltime"], view["policy"]["max_app_retries"]) == (60, 1)
    edits = await api.pool.fetch(
        "SELECT actor, state, changes FROM job_edits WHERE job_id = $1", job["id"]
    )
    assert [(e["actor"], e["state"]) for e in edits] == [(api.user.user.name, "configuring")]
    assert set(edits[0]["changes"]) == {"command", "inputs", "outputs", "policy.walltime"}
    assert (await _act(api, job["id"], "activate")).json()["counts"] == {"new": 3}


async def test_an_active_job_refuses_a_new_command_but_takes_new_budgets(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a"])

    command = await _edit(api, job["id"], {"command": "echo other"})
    budgets = await _edit(api, job["id"], {"policy": {"max_infra_retries": 5}, "max_in_flight": 2})
    same = await _edit(api, job["id"], {"command": "echo hello"})

    assert command.status_code == 409
    assert "command can no longer be changed" in command.json()["detail"]
    assert budgets.status_code == 200, budgets.text
    assert (budgets.json()["policy"]["max_infra_retries"], budgets.json()["max_in_flight"]) == (
        5,
        2,
    )
    assert same.status_code == 200  # the same command is no change
    assert await api.pool.fetchval("SELECT command FROM jobs WHERE id = $1", job["id"]) == (
        "echo hello"
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "nothing to change"),
        ({"command": "   "}, "command is required"),
        ({"policy": {"max_app_retries": -1}}, "greater than or equal to 0"),
        ({"policy": {"no_such": 1}}, "Extra inputs are not permitted"),
        ({"policy": {"analyser": "nope"}}, "unknown analyser"),
        ({"inputs": ["1", "2", "3", "4", "5", "6"]}, "at most 5 are accepted"),
        ({"type": "diagnostics"}, "Extra inputs are not permitted"),
        ({"command": None, "max_in_flight": None}, "command, max_in_flight cannot be null"),
        ({"retention_s": 0.5}, "greater than or equal to 1"),
    ],
)
async def test_a_bad_edit_is_a_422_that_names_the_problem(api: Api, body: Any, says: str) -> None:
    job = await _configuring(api, inputs=["a"])

    response = await _edit(api, job["id"], body)

    assert response.status_code == 422, response.text
    assert says in response.text
    assert (
        await api.pool.fetchval("SELECT count(*) FROM job_edits WHERE job_id = $1", job["id"]) == 0
    )


async def test_inputs_appended_to_a_configuring_job_are_held(api: Api) -> None:
    job = await _configuring(api, inputs=["a"])

    response = await api.client.post(
        f"/jobs/{job['id']}/inputs", json={"inputs": ["b"]}, headers=api.user.headers
    )

    assert response.status_code == 201, response.text
    assert (response.json()["task_ids"], response.json()["job"]["held_inputs"]) == ([], 2)


async def test_a_job_chained_from_a_configuring_job_gets_its_tasks_at_activation(
    api: Api,
) -> None:
    upstream = await _configuring(api, inputs=["a", "b"])
    await _test(api, upstream["id"], {})
    downstream = await api.submit(api.user, inputs_from=upstream["id"])
    assert await _tasks(api, downstream["id"]) == []  # a test task is no promised input

    await _act(api, upstream["id"], "activate")

    promised = await _tasks(api, downstream["id"])
    ups = [t for t in await _tasks(api, upstream["id"]) if not t["test"]]
    assert [t["input"] for t in promised] == [{"upstream_task": t["id"]} for t in ups]


async def test_a_configuring_chained_job_tests_an_upstream_task_and_chains_at_activation(
    api: Api,
) -> None:
    upstream = await api.submit(api.user, inputs=["a", "b"])
    ups = await _tasks(api, upstream["id"])
    downstream = await _configuring(api, inputs_from=upstream["id"])
    await api.client.post(
        f"/jobs/{upstream['id']}/inputs", json={"inputs": ["c"]}, headers=api.user.headers
    )

    test = await _test(api, downstream["id"], {"input_index": 1})
    activated = await _act(api, downstream["id"], "activate")

    assert test.status_code == 201, test.text
    assert test.json()["input"] == {"upstream_task": ups[1]["id"]}
    assert test.json()["prerequisites"] == [
        {"stage": "setup", "task_id": ups[1]["id"], "required": "completed"}
    ]
    assert activated.json()["counts"] == {"new": 3}


async def test_a_configuring_job_can_be_cancelled(api: Api) -> None:
    job = await _configuring(api, inputs=["a"])
    test = (await _test(api, job["id"], {})).json()

    response = await _act(api, job["id"], "cancel")

    assert response.status_code == 202, response.text
    assert response.json()["state"] == "cancelled"
    assert response.json()["test_counts"] == {"terminated": 1}
    assert (await _edit(api, job["id"], {"name": "x"})).status_code == 409
    cancelled = (await api.client.get(f"/tasks/{test['id']}", headers=api.user.headers)).json()
    assert (cancelled["state"], cancelled["failure_class"]) == ("terminated", "cancelled")


async def test_an_active_jobs_retention_can_be_set_and_cleared(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a"])

    short = await _edit(api, job["id"], {"retention_s": 30})
    kept = await _edit(api, job["id"], {"retention_s": 86400})
    cleared = await _edit(api, job["id"], {"retention_s": None})

    assert short.status_code == 422
    assert "the shortest this api accepts is 60 s" in short.text
    assert kept.status_code == 200, kept.text
    assert kept.json()["retention_s"] == 86400
    assert (cleared.status_code, cleared.json()["retention_s"]) == (200, None)


async def test_two_edits_at_once_do_not_undo_each_other(api: Api) -> None:
    job = await _configuring(api, inputs=["a"])
    async with api.pool.acquire() as holder:
        # given the job row held by someone (as an edit in progress would)
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", job["id"])
        second = asyncio.create_task(_edit(api, job["id"], {"policy": {"max_infra_retries": 7}}))
        await until_someone_blocked(api.pool)
        # when that edit commits first
        await holder.execute(
            "UPDATE jobs SET policy = policy || $2 WHERE id = $1", job["id"], {"max_app_retries": 5}
        )
        await transaction.commit()
        response = await second

    # then the second edit is laid over the first, not over what it read before
    assert response.status_code == 200, response.text
    policy = response.json()["policy"]
    assert (policy["max_app_retries"], policy["max_infra_retries"]) == (5, 7)


async def test_a_jobs_files_cannot_be_edited_and_the_refusal_says_what_to_do(api: Api) -> None:
    job = await api.submit(api.user, configuring=True, inputs=["a"])

    answer = await _edit(api, job["id"], {"files": {"run.sh": {"content": "ZWNobw=="}}})

    assert answer.status_code == 422, answer.text
    assert "files cannot be edited" in answer.text and "submit a new job" in answer.text
