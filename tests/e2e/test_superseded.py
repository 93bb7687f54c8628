"""A superseded task is history, not work, through the four services and the
installed `vigil` command: the newcomer's scenario, a restartable task killed with `kill -9`,
resubmitted, its clone completing, then the original recovered by hand."""

import asyncio
import os
import signal
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, vigil, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

FAST_RETRY = {"restartable": True, "backoff": {"initial_s": 0.1, "max_s": 0.2}}
#: Input b's first try sleeps a minute (until it is killed); every other try ends at once.
COMMAND = (
    'if [ "$VIGIL_INPUT" = b ] && [ "$VIGIL_TRY" = 1 ]; then sleep 60; fi; echo "done $VIGIL_INPUT"'
)


async def _get(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    response = await client.get(path, params=params)
    response.raise_for_status()
    return response.json()


async def _running(
    client: httpx.AsyncClient, events: Events, job_id: str, value: str
) -> dict[str, Any]:
    """The task of input `value`, once its command runs (it has a pid)."""
    [task] = [t for t in await _get(client, f"/jobs/{job_id}/tasks") if t["input"] == value]
    await events.wait_for(lambda k, b: k == f"task.on_cpu.{job_id}" and b["task_id"] == task["id"])
    return dict(await _get(client, f"/tasks/{task['id']}"))


async def test_a_task_killed_resubmitted_and_recovered_by_hand_runs_its_input_to_the_end_once(
    stack: Stack, client: httpx.AsyncClient, events: Events, env: dict[str, str]
) -> None:
    # given a restartable job of three inputs, the command of b killed with kill -9 as it runs
    submitted = await client.post(
        "/jobs", json={"command": COMMAND, "inputs": ["a", "b", "c"], "policy": FAST_RETRY}
    )
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    killed = await _running(client, events, job_id, "b")
    os.kill(killed["pid"], signal.SIGKILL)

    # when the triage resubmits it and the clone completes the job
    decision = await events.wait_key(f"task.resubmitted.{job_id}")
    assert decision["task_id"] == killed["id"]
    job = await wait_job(client, events, job_id)

    # then the job counts one task per input, the original apart, the clone under b's index
    assert (job["state"], job["counts"], job["superseded"]) == ("completed", {"completed": 3}, 1)
    original = await _get(client, f"/tasks/{killed['id']}")
    clone_id = original["superseded_by"]
    assert (original["state"], original["failure_class"]) == ("failed_on_cluster", "signal")
    assert original["decision"] == "resubmitted"
    assert "signal: resubmitted (1/3)" in original["decision_reason"]
    clone = await _get(client, f"/tasks/{clone_id}")
    assert (clone["state"], clone["index"], clone["resubmitted_from"]) == (
        "completed",
        original["index"],
        original["id"],
    )

    # and `vigil status` shows it as history, not as a failure
    status_job = await asyncio.to_thread(vigil, env, "status", job_id)
    assert status_job.returncode == 0, status_job.stderr
    assert "failed tasks" not in status_job.stdout
    history = status_job.stdout.split("resubmitted tasks", 1)[1]
    assert original["id"] in history and clone_id in history
    assert "resubmitted (1/3)" in history
    status_task = await asyncio.to_thread(vigil, env, "status", original["id"])
    assert status_task.returncode == 0, status_task.stderr
    rows = {
        line.split()[0]: line.split()[1:]
        for line in status_task.stdout.splitlines()
        if line.strip()
    }
    assert rows["superseded_by"][0] == clone_id
    assert rows["decision"][:4] == ["resubmitted:", "signal:", "resubmitted", "(1/3)"]

    # when the newcomer recovers the original by hand (and tries to restart or duplicate it)
    recovered = await asyncio.to_thread(vigil, env, "recover", original["id"])
    refusals = [
        await client.post(f"/tasks/{original['id']}/actions", json={"action": action})
        for action in ("restart_cluster", "duplicate")
    ]

    # then each is refused naming the clone, and nothing runs again
    assert recovered.returncode == 1, recovered.stdout + recovered.stderr
    assert f"its input runs on as task {clone_id} (completed)" in recovered.stderr
    assert "(409)" in recovered.stderr
    for refused in refusals:
        assert refused.status_code == 409, refused.text
        assert clone_id in refused.json()["detail"]
    tasks = await _get(client, f"/jobs/{job_id}/tasks")
    assert sorted((t["input"], t["state"]) for t in tasks) == [
        ("a", "completed"),
        ("b", "completed"),
        ("b", "failed_on_cluster"),
        ("c", "completed"),
    ]
    job = await _get(client, f"/jobs/{job_id}")
    assert (job["state"], job["counts"]) == ("completed", {"completed": 3})
    logs = await _get(client, f"/jobs/{job_id}/logs")
    assert sorted(line["line"] for line in logs["items"]) == ["done a", "done b", "done c"]
