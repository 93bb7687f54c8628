"""A user submits a shell job over HTTP; it runs through every stage and ends `completed`."""

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

NORMAL_PATH = [
    "new",
    "setting_up",
    "queued",
    "on_cpu",
    "data_ready",
    "post_processing",
    "completed",
]


async def test_when_a_job_runs__every_task_walks_the_normal_path_and_the_job_succeeds(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given
    command = (
        'echo "hello $VIGIL_INPUT from $VIGIL_TASK_INDEX run $VIGIL_RUN_NUMBER"; '
        'echo "ERROR: not really" >&2; echo "plain stderr" >&2; echo "PROGRESS: 50"; '
        'test "$PWD" = "$VIGIL_WORKDIR" && echo "in workdir"; echo done > out.txt'
    )
    body = {
        "name": "happy",
        "command": command,
        "inputs": ["a", "b", "c"],
        "outputs": ["out.txt"],
        "policy": {"fail_on_log": []},  # the ERROR line is only there to check its severity
    }

    # when
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = await wait_job(client, events, job_id)

    # then
    assert job["state"] == "completed"
    assert job["counts"] == {"completed": 3}
    assert "job.succeeded." + job_id in events.routing_keys()
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert len(tasks) == 3
    for task in tasks:
        assert events.task_states(task["id"]) == NORMAL_PATH
        assert task["state"] == "completed"
        assert task["progress"] == 50
        assert (stack.work_root / job_id / task["id"] / "out.txt").read_text() == "done\n"

    logs = (await client.get(f"/jobs/{job_id}/logs", params={"task": tasks[1]["id"]})).json()
    lines = [(r["severity"], r["stream"], r["line"]) for r in logs["items"]]
    assert lines[0] == ("info", "stdout", "hello b from 1 run 1")
    assert ("error", "stderr", "ERROR: not really") in lines
    assert ("warning", "stderr", "plain stderr") in lines
    assert ("info", "stdout", "in workdir") in lines
    seqs = [r["seq"] for r in logs["items"]]
    assert seqs == sorted(seqs)
    assert any(k == f"log.error.{job_id}" for k in events.routing_keys())


async def test_when_a_command_exits_non_zero__the_task_fails_with_class_exit_and_the_job_fails(
    client: httpx.AsyncClient, events: Events
) -> None:
    response = await client.post("/jobs", json={"command": "echo oops; exit 3", "inputs": ["x"]})
    job_id = response.json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "failed"
    assert f"job.failed.{job_id}" in events.routing_keys()
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert task["state"] == "failed_on_cluster"
    assert task["failure_class"] == "exit"
    assert task["exit_code"] == 3
    assert "exited with code 3" in task["error_brief"]
    detail = (await client.get(f"/tasks/{task['id']}")).json()
    assert [a["stage"] for a in detail["attempts"]] == ["setup", "cluster"]
    assert detail["attempts"][-1]["exit_code"] == 3


async def test_when_post_processing_has_nothing_to_do__the_task_still_walks_every_stage(
    client: httpx.AsyncClient, events: Events
) -> None:
    """No outputs, exit 0, a status file saying success: the worker ends the task at the exit
    in one move, which still passes through every state and records the stage's attempt."""
    command = 'echo \'{"status": "success"}\' > "$VIGIL_STATUS_FILE"'
    response = await client.post("/jobs", json={"command": command, "inputs": ["x"]})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "completed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert events.task_states(task["id"]) == NORMAL_PATH
    detail = (await client.get(f"/tasks/{task['id']}")).json()
    attempts = [(a["stage"], a["outcome"]) for a in detail["attempts"]]
    assert attempts == [
        ("setup", "queued"),
        ("cluster", "data_ready"),
        ("post_processing", "completed"),
    ]
    assert all(a["ended_at"] is not None for a in detail["attempts"])


async def test_when_the_status_file_says_fatal__post_processing_runs_and_fails_the_task(
    client: httpx.AsyncClient, events: Events
) -> None:
    command = 'echo \'{"status": "fatal", "message": "no convergence"}\' > "$VIGIL_STATUS_FILE"'
    response = await client.post("/jobs", json={"command": command, "inputs": ["x"]})
    job_id = response.json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "failed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert task["failure_class"] == "exit"
    assert "no convergence" in task["error_brief"]
