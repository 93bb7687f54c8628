"""Prerequisites across jobs (design §4), driven through real services."""

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job

pytestmark = pytest.mark.e2e


async def _submit(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, str]:
    response = await client.post("/jobs", json={"type": "diagnostics", **body})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    return job_id, task["id"]


def _position(events: Events, task_id: str, state: str) -> int:
    for i, (key, body) in enumerate(events.received):
        if key.startswith(f"task.{state}.") and body["task_id"] == task_id:
            return i
    raise AssertionError(f"{task_id} never reached {state}: {events.routing_keys()}")


async def submit_timeline(client: httpx.AsyncClient) -> list[tuple[str, str]]:
    """t1 with a delay in every stage; t2 waits before setup for t1 queued; t3 waits before
    post-processing for t1 data_ready and t2 completed: the (job, task) of each."""
    delays = {"setup_delay": 1, "cluster_delay": 1, "post_delay": 1}
    j1, t1 = await _submit(client, {"name": "t1", "params": delays})
    j2, t2 = await _submit(client, {"name": "t2", "prerequisites": {"setup": {t1: "queued"}}})
    post = {"post_processing": {t1: "data_ready", t2: "completed"}}
    j3, t3 = await _submit(client, {"name": "t3", "prerequisites": post})
    return [(j1, t1), (j2, t2), (j3, t3)]


def assert_timeline(position: Callable[[str, str], int], t1: str, t2: str, t3: str) -> None:
    """The order the design gives the three of `submit_timeline`, by `position(task, state)`:
    where the task's event of that state came among the events."""
    # t2 set up only once t1 was queued, and finished while t1 still ran
    assert position(t1, "queued") < position(t2, "setting_up")
    assert position(t2, "completed") < position(t1, "completed")
    # and t3 ran its command at once, then waited in data_ready for both prerequisites
    assert position(t3, "data_ready") < position(t1, "data_ready")
    t3_post = position(t3, "post_processing")
    assert position(t1, "data_ready") < t3_post
    assert position(t2, "completed") < t3_post


async def test_when_three_tasks_depend_on_each_other__they_start_in_the_order_the_design_gives(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given t1 with a delay in every stage; t2 waits before setup for t1 queued; t3 waits before
    # post-processing for t1 data_ready and t2 completed
    (j1, t1), (j2, t2), (j3, t3) = await submit_timeline(client)

    # when all three run
    for job_id in (j1, j2, j3):
        assert (await wait_job(client, events, job_id))["state"] == "completed"

    # then they ran in the order the design gives, and t3 knows what it waited for
    assert_timeline(lambda task_id, state: _position(events, task_id, state), t1, t2, t3)
    task = (await client.get(f"/tasks/{t3}")).json()
    assert {(p["stage"], p["task_id"], p["required"]) for p in task["prerequisites"]} == {
        ("post_processing", t1, "data_ready"),
        ("post_processing", t2, "completed"),
    }


async def test_when_a_prerequisite_fails__the_waiting_task_fails_its_prerequisites(
    client: httpx.AsyncClient, events: Events
) -> None:
    _j1, t1 = await _submit(client, {"params": {"fail_in": "cluster"}})
    j2, t2 = await _submit(client, {"prerequisites": {"setup": {t1: "completed"}}})

    assert (await wait_job(client, events, j2))["state"] == "failed"

    task = (await client.get(f"/tasks/{t2}")).json()
    assert task["state"] == "failed_setup_prerequisites"
    assert t1 in task["error_brief"] and "completed" in task["error_brief"]
    assert task["attempts"] == []  # it never started
    assert (await client.get(f"/tasks/{t1}")).json()["state"] == "failed_on_cluster"


async def test_when_a_task_waits_for_a_failure__it_runs_once_the_other_task_failed(
    client: httpx.AsyncClient, events: Events
) -> None:
    _j1, t1 = await _submit(client, {"params": {"fail_in": "setup", "cluster_delay": 0}})
    j2, t2 = await _submit(client, {"prerequisites": {"setup": {t1: "failed"}}})

    assert (await wait_job(client, events, j2))["state"] == "completed"
    assert _position(events, t1, "failed_to_setup") < _position(events, t2, "setting_up")


async def test_when_the_status_file_says_recoverable__the_task_is_retried_with_its_resume(
    client: httpx.AsyncClient, events: Events
) -> None:
    script = (
        'echo "try $VIGIL_TRY"; '
        'if [ -z "$VIGIL_RESUME" ]; then '
        'echo \'{"status": "recoverable", "message": "seed was bad", "resume": {"seed": 7}}\''
        ' > "$VIGIL_STATUS_FILE"; exit 1; fi; '
        'echo "resumed with $VIGIL_RESUME"'
    )
    body = {"command": script, "policy": {"max_app_retries": 1}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "completed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    states = events.task_states()
    assert states[states.index("on_cpu") :] == [
        "on_cpu", "failed_on_cluster", "recover_cluster", "recovering_cluster", "queued",
        "on_cpu", "data_ready", "post_processing", "completed",
    ]  # fmt: skip
    logs = (await client.get(f"/jobs/{job_id}/logs")).json()["items"]
    assert [line["line"] for line in logs] == ["try 1", "try 2", 'resumed with {"seed": 7}']
    assert task["run_number"] == 1


async def test_when_the_status_file_says_fatal__the_task_is_not_retried(
    client: httpx.AsyncClient, events: Events
) -> None:
    script = 'echo \'{"status": "fatal", "message": "disk full"}\' > "$VIGIL_STATUS_FILE"; exit 2'
    body = {"command": script, "policy": {"max_app_retries": 3}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]

    assert (await wait_job(client, events, job_id))["state"] == "failed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert (task["state"], task["failure_class"]) == ("failed_on_cluster", "exit")
    assert "disk full" in task["error_brief"]
    assert not any(k.startswith("task.recover_cluster.") for k in events.routing_keys())


async def test_when_failed_prerequisites_are_recovered__the_task_waits_again_and_runs(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given t2 failed its prerequisites because t1 failed
    j1, t1 = await _submit(client, {"params": {"fail_in": "cluster", "fail_once": True}})
    j2, t2 = await _submit(client, {"prerequisites": {"setup": {t1: "completed"}}})
    assert (await wait_job(client, events, j2))["state"] == "failed"

    # when t1 is recovered, then t2
    assert (
        await client.post(f"/tasks/{t1}/actions", json={"action": "recover"})
    ).status_code == 202
    await events.wait_for(lambda k, b: k == f"task.completed.{j1}" and b["task_id"] == t1)
    assert (
        await client.post(f"/tasks/{t2}/actions", json={"action": "recover"})
    ).status_code == 202

    # then t2 is evaluated again from `new`, runs, and its job completes
    await events.wait_for(lambda k, b: k == f"task.completed.{j2}" and b["task_id"] == t2)
    assert _position(events, t1, "completed") < _position(events, t2, "setting_up")
    await events.wait_key(f"job.succeeded.{j2}")


async def test_when_a_post_processing_prerequisite_fails__recovery_returns_to_data_ready(
    client: httpx.AsyncClient, events: Events
) -> None:
    _j1, t1 = await _submit(client, {"params": {"fail_in": "setup"}})
    j2, t2 = await _submit(client, {"prerequisites": {"post_processing": {t1: "completed"}}})

    assert (await wait_job(client, events, j2))["state"] == "failed"
    task = (await client.get(f"/tasks/{t2}")).json()
    assert task["state"] == "failed_post_processing_prerequisites"

    response = await client.post(f"/tasks/{t2}/actions", json={"action": "recover"})

    assert response.status_code == 202
    assert response.json()["task"]["state"] == "data_ready"
