"""A hostile status file, end to end: a job that leaves a FIFO (or a link to a device) where
its status file goes blocked the worker's event loop on reading it; heartbeats stopped, other
users' tasks were declared lost. Now that task fails, saying why, and the host works on."""

import asyncio

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("trap", "why"),
    [
        ('mkfifo "$VIGIL_STATUS_FILE"', "is not a regular file (a FIFO)"),
        ('ln -s /dev/zero "$VIGIL_STATUS_FILE"', "symbolic link"),
    ],
)
async def test_a_job_that_booby_traps_its_status_file_fails_alone_and_the_host_works_on(
    client: httpx.AsyncClient, events: Events, trap: str, why: str
) -> None:
    trapped = (await client.post("/jobs", json={"command": trap})).json()["id"]
    bystander = (await client.post("/jobs", json={"command": "sleep 0.3; echo fine"})).json()

    ended = await asyncio.gather(
        wait_job(client, events, trapped), wait_job(client, events, bystander["id"])
    )

    assert [job["state"] for job in ended] == ["failed", "completed"]
    [task] = (await client.get(f"/jobs/{trapped}/tasks")).json()
    assert task["state"] == "failed_on_cluster"
    assert "unusable status file" in task["error_brief"] and why in task["error_brief"]


async def test_a_nul_byte_in_the_output_hides_no_line(
    client: httpx.AsyncClient, events: Events
) -> None:
    # Finding 5: PostgreSQL refused the line, the whole batch with it, and the task's log
    # ended up empty: a user could hide what a command printed.
    script = r"printf 'before\n'; printf 'hid\000den\n'; printf 'after\n'"
    job_id = (await client.post("/jobs", json={"command": script})).json()["id"]

    assert (await wait_job(client, events, job_id))["state"] == "completed"

    lines = [item["line"] for item in (await client.get(f"/jobs/{job_id}/logs")).json()["items"]]
    assert lines == ["before", "hid\ufffdden", "after"]
