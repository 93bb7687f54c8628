"""Recovery, restart, duplicate, cancel, datasets and chaining, driven through real services."""

from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e


async def _one_task_job(
    client: httpx.AsyncClient, events: Events, body: dict[str, Any], end: str
) -> tuple[str, dict[str, Any]]:
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = await wait_job(client, events, job_id)
    assert job["state"] == end
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    return job_id, task


async def _act(client: httpx.AsyncClient, task_id: str, action: str) -> dict[str, Any]:
    response = await client.post(f"/tasks/{task_id}/actions", json={"action": action})
    assert response.status_code == 202, response.text
    return dict(response.json())


async def _settled(
    client: httpx.AsyncClient, events: Events, job_id: str, n: int
) -> dict[str, Any]:
    """Wait for the job's `n`-th final event (a reopened job finishes again)."""
    await events.wait_for(lambda _k, _b: events.finals(job_id) >= n)
    return dict((await client.get(f"/jobs/{job_id}")).json())


HOOKS = {
    "setup": "recover_from_setup_failure",
    "cluster": "recover_from_cluster_failure",
    "post_processing": "recover_from_post_processing_failure",
}


@pytest.mark.parametrize(
    ("stage", "failed_state", "hook_states"),
    [
        ("setup", "failed_to_setup", ["recover_setup", "recovering_setup", "new"]),
        ("cluster", "failed_on_cluster", ["recover_cluster", "recovering_cluster", "queued"]),
        (
            "post_processing",
            "failed_to_post_process",
            ["recover_post_processing", "recovering_post_processing", "data_ready"],
        ),
    ],
)
async def test_when_a_failed_stage_is_recovered__the_hook_runs_and_the_task_completes(
    client: httpx.AsyncClient, events: Events, stage: str, failed_state: str, hook_states: list[str]
) -> None:
    params = {"fail_in": stage, "fail_once": True, "fail_how": "raise"}
    if stage == "cluster":
        params["fail_how"] = "false"
    body = {"type": "diagnostics", "params": params}
    job_id, task = await _one_task_job(client, events, body, "failed")
    assert task["state"] == failed_state
    assert task["failure_class"] in ("hook", "exit")

    await _act(client, task["id"], "recover")

    job = await _settled(client, events, job_id, 2)
    assert job["state"] == "completed"
    after = events.task_states(task["id"])
    start = after.index(hook_states[0])
    assert after[start : start + 3] == hook_states
    assert after[-1] == "completed"
    detail = (await client.get(f"/tasks/{task['id']}")).json()
    assert detail["run_number"] == 1
    assert detail["failure_class"] is None
    hooks = [a for a in detail["attempts"] if a["stage"].startswith("recover_from_")]
    assert [(h["stage"], h["outcome"]) for h in hooks] == [(HOOKS[stage], hook_states[-1])]


RESTARTS = {
    "restart_setup": ["restart_setup", "restarting_setup", "new", "setting_up", "queued"],
    "restart_cluster": ["restart_cluster", "restarting_cluster", "queued", "on_cpu"],
    "restart_post_processing": [
        "restart_post_processing", "restarting_post_processing", "data_ready", "post_processing",
    ],
}  # fmt: skip


@pytest.mark.parametrize("action", list(RESTARTS))
async def test_when_a_completed_task_is_restarted__it_runs_again_from_that_stage_as_run_2(
    stack: Stack, client: httpx.AsyncClient, events: Events, action: str
) -> None:
    body = {"command": 'echo "run $VIGIL_RUN_NUMBER"'}
    job_id, task = await _one_task_job(client, events, body, "completed")

    await _act(client, task["id"], action)

    job = await _settled(client, events, job_id, 2)
    assert job["state"] == "completed"
    states = events.task_states(task["id"])
    restarted = states[states.index(action) :]
    assert restarted[: len(RESTARTS[action])] == RESTARTS[action]
    assert restarted[-1] == "completed"
    detail = (await client.get(f"/tasks/{task['id']}")).json()
    assert detail["run_number"] == 2
    run2 = (await client.get(f"/jobs/{job_id}/logs", params={"run": 2})).json()["items"]
    ran_again = action != "restart_post_processing"
    assert [r["line"] for r in run2] == (["run 2"] if ran_again else [])
    run_dir = stack.work_root / job_id / task["id"] / ".vigil"
    assert (run_dir / "run1.stdout").read_text() == "run 1\n"
    assert (run_dir / "run2.stdout").exists() == ran_again


async def test_when_a_hook_refuses__the_task_keeps_its_state_and_the_attempt_says_why(
    client: httpx.AsyncClient, events: Events
) -> None:
    body = {"type": "diagnostics", "params": {"refuse_hooks": True}}
    job_id, task = await _one_task_job(client, events, body, "completed")

    await _act(client, task["id"], "restart_setup")
    await events.wait_for(
        lambda k, b: k == f"task.completed.{job_id}" and b.get("previous") == "restarting_setup"
    )

    detail = (await client.get(f"/tasks/{task['id']}")).json()
    assert (detail["state"], detail["run_number"]) == ("completed", 1)
    hook = detail["attempts"][-1]
    assert hook["stage"] == "restart_at_setup"
    assert hook["error_brief"] == "restart_at_setup() returned False"


async def test_when_an_action_does_not_fit_the_state__409_names_the_state_and_allowed_ones(
    client: httpx.AsyncClient, events: Events
) -> None:
    _job_id, task = await _one_task_job(client, events, {"command": "true"}, "completed")

    response = await client.post(f"/tasks/{task['id']}/actions", json={"action": "recover"})

    assert response.status_code == 409
    assert "completed" in response.json()["detail"]
    assert "failed_on_cluster" in response.json()["detail"]


async def test_when_a_task_is_duplicated__a_new_task_runs_in_a_new_work_dir(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    job_id, task = await _one_task_job(client, events, {"command": "exit 1"}, "failed")

    created = (await _act(client, task["id"], "duplicate"))["created"]

    assert created["id"] != task["id"] and created["input"] == task["input"]
    assert (await _settled(client, events, job_id, 2))["state"] == "failed"
    assert (stack.work_root / job_id / created["id"]).is_dir()
    assert (await client.get(f"/tasks/{created['id']}")).json()["state"] == "failed_on_cluster"


async def test_when_a_running_task_is_cancelled__its_process_is_killed_and_it_is_terminated(
    client: httpx.AsyncClient, events: Events
) -> None:
    job_id = (await client.post("/jobs", json={"command": "sleep 60"})).json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}")
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    process = psutil.Process(task["pid"])

    await _act(client, task["id"], "cancel")

    assert (await wait_job(client, events, job_id))["state"] == "failed"
    _gone, alive = psutil.wait_procs([process], timeout=5)
    assert alive == []
    detail = (await client.get(f"/tasks/{task['id']}")).json()
    assert (detail["state"], detail["failure_class"]) == ("terminated", "cancelled")


async def test_when_inputs_are_appended__new_tasks_run_and_the_job_completes_again(
    client: httpx.AsyncClient, events: Events
) -> None:
    job_id, _ = await _one_task_job(client, events, {"command": "echo $VIGIL_INPUT"}, "completed")

    response = await client.post(f"/jobs/{job_id}/inputs", json={"inputs": ["more", "again"]})
    assert response.status_code == 201, response.text

    job = await _settled(client, events, job_id, 2)
    assert job["state"] == "completed"
    assert job["counts"] == {"completed": 3}


async def test_when_a_job_chains_onto_another__each_task_starts_when_its_upstream_completes(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given an upstream job whose two tasks end a second apart
    upstream_body = {
        "command": 'sleep "$VIGIL_INPUT"; echo "made by $VIGIL_TASK_INDEX" > out.txt',
        "inputs": ["0", "2"],
        "outputs": ["out.txt"],
    }
    up = (await client.post("/jobs", json=upstream_body)).json()["id"]

    # when a job chains onto it
    down_body = {"command": "cat out.txt", "inputs_from": up}
    down = (await client.post("/jobs", json=down_body)).json()["id"]

    # then each downstream task read its own upstream output, the first before upstream ended
    assert (await wait_job(client, events, down))["state"] == "completed"
    down_tasks = (await client.get(f"/jobs/{down}/tasks")).json()
    logs = (await client.get(f"/jobs/{down}/logs")).json()["items"]
    by_task = {r["task_id"]: r["line"] for r in logs}
    assert [by_task[t["id"]] for t in down_tasks] == ["made by 0", "made by 1"]
    first_done = events.routing_keys().index(f"task.completed.{down}")
    assert first_done < events.routing_keys().index(f"job.succeeded.{up}")


async def test_when_a_task_is_held__it_waits_until_released(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given a task that cannot start yet (it waits for a running task), put on hold
    blocker = (await client.post("/jobs", json={"command": "sleep 60"})).json()["id"]
    [running] = (await client.get(f"/jobs/{blocker}/tasks")).json()
    body = {"command": "true", "prerequisites": {"setup": {running["id"]: "completed"}}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert (await _act(client, task["id"], "hold"))["task"]["state"] == "on_hold"

    # when the blocker is cancelled and the held task released
    await _act(client, running["id"], "cancel")
    await events.wait_key(f"job.failed.{blocker}")
    assert (await client.get(f"/tasks/{task['id']}")).json()["state"] == "on_hold"
    await _act(client, task["id"], "release")

    # then its prerequisite can no longer be met: it fails them, explained
    assert (await wait_job(client, events, job_id))["state"] == "failed"
    after = (await client.get(f"/tasks/{task['id']}")).json()
    assert after["state"] == "failed_setup_prerequisites"
    assert events.task_states(task["id"])[1:] == ["on_hold", "new", "failed_setup_prerequisites"]


async def test_when_a_job_is_suspended__nothing_new_starts_until_it_resumes(
    client: httpx.AsyncClient, events: Events
) -> None:
    body = {"command": "true", "inputs": ["a", "b"]}
    job_id = (await client.post("/jobs", json={**body, "policy": {}})).json()["id"]
    await client.post(f"/jobs/{job_id}/actions", json={"action": "throttle", "max_in_flight": 1})
    suspended = await client.post(f"/jobs/{job_id}/actions", json={"action": "suspend"})
    assert suspended.status_code == 202 and suspended.json()["state"] == "suspended"

    resumed = await client.post(f"/jobs/{job_id}/actions", json={"action": "resume"})

    assert resumed.status_code == 202
    assert (await wait_job(client, events, job_id))["state"] == "completed"
    again = await client.post(f"/jobs/{job_id}/actions", json={"action": "resume"})
    assert again.status_code == 409 and "completed" in again.json()["detail"]


async def test_when_a_failed_job_is_recovered__every_failed_task_recovers_and_it_completes(
    client: httpx.AsyncClient, events: Events
) -> None:
    params = {"fail_in": "cluster", "fail_once": True}
    body = {"type": "diagnostics", "params": params, "inputs": ["a", "b"]}
    job_id = (await client.post("/jobs", json=body)).json()["id"]
    assert (await wait_job(client, events, job_id))["state"] == "failed"

    response = await client.post(f"/jobs/{job_id}/actions", json={"action": "recover_failed"})

    assert response.status_code == 202
    job = await _settled(client, events, job_id, 2)
    assert (job["state"], job["counts"]) == ("completed", {"completed": 2})


async def test_when_a_job_is_cancelled__its_running_tasks_are_killed_and_terminated(
    client: httpx.AsyncClient, events: Events
) -> None:
    job_id = (await client.post("/jobs", json={"command": "sleep 60", "inputs": ["a", "b"]})).json()
    job_id = job_id["id"]
    for _ in range(2):
        await events.wait_for(
            lambda k, _b: events.routing_keys().count(f"task.on_cpu.{job_id}") == 2
        )
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    processes = [psutil.Process(t["pid"]) for t in tasks]  # before they can be killed

    response = await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})

    assert response.status_code == 202 and response.json()["state"] == "cancelled"
    await events.wait_key(f"job.cancelled.{job_id}")
    _gone, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == []
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert [t["state"] for t in tasks] == ["terminated", "terminated"]
