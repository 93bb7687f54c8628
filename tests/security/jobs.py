"""What the tests of hostile jobs share: a job run to its end and its output lines."""

from typing import Any

import httpx

from tests.e2e.conftest import Events, wait_job


async def job_lines(client: httpx.AsyncClient, events: Events, body: dict[str, Any]) -> list[str]:
    """Submit `body`, wait for its job to complete, and return its output lines."""
    answer = await client.post("/jobs", json=body)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    job = await wait_job(client, events, job_id)
    assert job["state"] == "completed", job
    items = (await client.get(f"/jobs/{job_id}/logs")).json()["items"]
    return [item["line"] for item in items]
