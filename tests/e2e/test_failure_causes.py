"""Every failure names its cause, as a user reads it in `GET /tasks/{id}`: a declared output
the command never wrote, a job's script without its exec bit, a command bash did not find."""

import base64
import uuid
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job

pytestmark = pytest.mark.e2e


async def _failed_task(
    client: httpx.AsyncClient, events: Events, body: dict[str, Any]
) -> dict[str, Any]:
    """Submit `body` (one input), wait for the job's end; its one task, which failed."""
    answer = await client.post("/jobs", json={"inputs": ["a"], **body})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    job = await wait_job(client, events, job_id)
    assert job["state"] == "failed", job
    [listed] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    task = (await client.get(f"/tasks/{listed['id']}")).json()
    assert task["state"] == "failed_on_cluster", task
    return dict(task)


async def test_a_declared_output_never_written_is_named(
    client: httpx.AsyncClient, events: Events
) -> None:
    body = {"command": "echo computed > other.dat", "outputs": ["out.dat"]}

    task = await _failed_task(client, events, body)

    assert (task["failure_class"], task["exit_code"]) == ("exit", 0)
    assert task["error_brief"] == "output out.dat was not written"


async def test_a_jobs_script_without_its_exec_bit_is_named_with_the_executable_flag(
    client: httpx.AsyncClient, events: Events
) -> None:
    script = base64.b64encode(b"#!/bin/sh\necho hello\n").decode()
    body = {"command": "./bin/run.sh", "files": {"bin/run.sh": {"content": script}}}

    task = await _failed_task(client, events, body)

    assert (task["failure_class"], task["exit_code"]) == ("exit", 126)
    brief = task["error_brief"]
    assert brief.startswith("command exited with code 126: bin/run.sh is not executable"), brief
    assert '"executable": true in the job\'s files' in brief


async def test_a_command_not_found_is_named_as_bash_reported_it(
    client: httpx.AsyncClient, events: Events
) -> None:
    missing = f"no-such-tool-{uuid.uuid4().hex[:8]}"

    task = await _failed_task(client, events, {"command": f"echo starting\n{missing} --fast"})

    assert (task["failure_class"], task["exit_code"]) == ("exit", 127)
    assert task["error_brief"].startswith(
        f"command exited with code 127: command not found: {missing} (bash: "
    ), task["error_brief"]


async def test_a_request_no_host_can_hold_is_accepted_with_a_warning_naming_the_largest_host(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given: the stack's host is live (its worker ran a job), with its capacity advertised
    answer = await client.post("/jobs", json={"command": "true", "inputs": ["a"]})
    await wait_job(client, events, answer.json()["id"])
    [host] = (await client.get("/hosts")).json()
    cpus = int(host["capacity"]["cpus"])

    # when: a job asks four times its CPUs
    answer = await client.post(
        "/jobs", json={"command": "true", "inputs": ["a"], "resources": {"cpus": 4 * cpus}}
    )

    # then: it is accepted (a larger host may join), and told that none can hold it now
    assert answer.status_code == 201, answer.text
    [warning] = answer.json()["warnings"]
    assert warning.startswith(
        f"resources: no host can ever hold it: needs {4 * cpus} cpus; the largest host,"
        f" {host['id']}, has {cpus} cpus"
    ), warning
    assert "too_large" in warning and "VIGIL_REFUSE_UNSATISFIABLE" in warning
    cancelled = await client.post(f"/jobs/{answer.json()['id']}/actions", json={"action": "cancel"})
    assert cancelled.status_code == 202, cancelled.text
