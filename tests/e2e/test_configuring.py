"""Try before production on the real services: a configuring job runs only its test
tasks, is fixed by an edit, and once activated runs its inputs with the test outputs gone."""

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job

pytestmark = pytest.mark.e2e

# Writes its input to out.txt; fails unless the input is a word (the bug the test finds).
BUGGY = 'test "$VIGIL_INPUT" != "c" && echo "$VIGIL_INPUT" > out.txt'
FIXED = 'echo "$VIGIL_INPUT" > out.txt'


async def _task_end(events: Events, task_id: str) -> str:
    """The state a task came to rest in (completed or a failed state)."""
    ends = ("completed", "failed_on_cluster", "failed_to_setup", "failed_to_post_process")
    _key, body = await events.wait_for(
        lambda _k, b: (
            b.get("type") == "task_event" and b["task_id"] == task_id and b["state"] in ends
        )
    )
    return str(body["state"])


def _gone(path: Path, within: float = 20.0) -> bool:
    """Whether `path` is gone within `within` seconds (a worker removes it: no event says so)."""
    deadline = time.monotonic() + within
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _outputs(tasks: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(t["index"], Path(t["workdir"], "out.txt").read_text()) for t in tasks]


async def test_a_configuring_job_is_tested_fixed_and_activated(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given a configuring job: nothing runs on its own
    body: dict[str, Any] = {
        "name": "campaign",
        "command": BUGGY,
        "inputs": ["a", "b", "c"],
        "outputs": ["out.txt"],
        "configuring": True,
    }
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    # when the third input is tried, the test task shows the bug
    failing = (await client.post(f"/jobs/{job_id}/tests", json={"input_index": 2})).json()
    assert await _task_end(events, failing["id"]) == "failed_on_cluster"

    # and an edited command passes the same test, its output in its work dir
    fixed = await client.patch(f"/jobs/{job_id}", json={"command": FIXED})
    assert fixed.status_code == 200, fixed.text
    passing = (await client.post(f"/jobs/{job_id}/tests", json={"input_index": 2})).json()
    assert await _task_end(events, passing["id"]) == "completed"
    tested = (await client.get(f"/tasks/{passing['id']}")).json()
    output = Path(tested["workdir"]) / "out.txt"
    assert output.read_text() == "c\n"
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert (job["state"], job["counts"]) == ("configuring", {})
    assert job["test_counts"] == {"failed_on_cluster": 1, "completed": 1}

    # then activation runs every input and throws the test outputs away
    activated = await client.post(f"/jobs/{job_id}/actions", json={"action": "activate"})
    assert activated.status_code == 202, activated.text
    assert await asyncio.to_thread(_gone, Path(tested["workdir"]))
    done = await wait_job(client, events, job_id)
    assert (done["state"], done["counts"]) == ("completed", {"completed": 3})
    assert f"job.activated.{job_id}" in events.routing_keys()
    tasks = [t for t in (await client.get(f"/jobs/{job_id}/tasks")).json() if not t["test"]]
    assert _outputs(tasks) == [
        (0, "a\n"),
        (1, "b\n"),
        (2, "c\n"),
    ]

    # and the command of the active job can no longer change
    refused = await client.patch(f"/jobs/{job_id}", json={"command": BUGGY})
    assert refused.status_code == 409
    assert "command can no longer be changed" in refused.json()["detail"]
