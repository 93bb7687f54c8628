"""The largest submission the defaults allow, on a stack at the defaults: 100,000 inputs in one
body within the api's 16 MiB limit, every task made, the job's tasks running on the CPUs the
worker found."""

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shared.host import capacity
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.defaults]

#: What the README promises of the defaults: 100,000 inputs a job, a body of 16 MiB.
INPUTS = 100_000
BODY_LIMIT = 16 * 1024 * 1024


async def _job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/jobs/{job_id}")
    response.raise_for_status()
    return dict(response.json())


async def _until(
    client: httpx.AsyncClient, job_id: str, done: Callable[[dict[str, Any]], bool], within: float
) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while not done(job := await _job(client, job_id)):  # noqa: ASYNC110
            await asyncio.sleep(0.5)  # polling the API, as `vigil status` does
    return job


async def test_a_submission_of_100000_inputs_fits_the_default_limits_and_runs(
    stack: Stack,
) -> None:
    body = {
        "name": "largest",
        "command": 'test -n "$VIGIL_INPUT"',
        "inputs": [f"sample-{n:06d}" for n in range(INPUTS)],
    }
    content = json.dumps(body).encode()
    assert len(content) < BODY_LIMIT
    headers = {"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=120) as client:
        # when: the whole body at once, as a client of the default api sends it
        response = await client.post("/jobs", content=content)
        assert response.status_code == 201, response.text[:2000]
        job_id = response.json()["id"]

        # then: a task per input, and the tasks run, as many at once as the host has CPUs
        job = await _job(client, job_id)
        assert sum(job["counts"].values()) == INPUTS, job["counts"]
        page = await client.get(f"/jobs/{job_id}/tasks", params={"after": INPUTS - 2})
        [last] = page.json()
        assert (last["index"], last["input"]) == (INPUTS - 1, f"sample-{INPUTS - 1:06d}"), last
        job = await _until(client, job_id, lambda j: j["counts"].get("completed", 0) >= 20, 60)
        [host] = (await client.get("/hosts")).json()
        cpus = capacity.detect().resources.millicpus / 1000  # as this machine has them
        assert (host["capacity"]["cpus"], host["slots"]) == (cpus, math.ceil(cpus)), host
        assert set(job["counts"]) <= {
            "new",
            "setting_up",
            "queued",
            "on_cpu",
            "data_ready",
            "post_processing",
            "completed",
        }, job

        # and a cancel ends them all
        cancel = await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})
        assert cancel.status_code in (200, 202), cancel.text
        job = await _until(client, job_id, lambda j: j["state"] == "cancelled", 60)
    assert sum(job["counts"].values()) == INPUTS, job["counts"]
