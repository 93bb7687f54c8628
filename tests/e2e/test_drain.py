"""Draining a host: it finishes what it holds and takes no new task until an
operator undrains it; jobs say why they wait meanwhile."""

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job

pytestmark = pytest.mark.e2e

HOST = "e2e-host"
#: Between the database's clock and this test's, read a few milliseconds apart.
_MARGIN_S = 0.05


async def _heartbeat_seen(client: httpx.AsyncClient) -> None:
    """Wait until the host's row holds a worker heartbeat sent after this call began (the
    worker learns its admission with each one). Its age is younger than the time waited
    then; an age younger than the one first read was not enough: a beat reaches the row up
    to a second after it reached Redis (the leader's relay), so one read just after a
    write could be younger than every beat that followed."""
    started = time.monotonic()
    async with asyncio.timeout(10):
        while (await _host(client))["worker_heartbeat_age_s"] + _MARGIN_S >= (  # noqa: ASYNC110
            time.monotonic() - started
        ):
            await asyncio.sleep(0.05)


async def _host(client: httpx.AsyncClient) -> dict[str, Any]:
    [host] = [h for h in (await client.get("/hosts")).json() if h["id"] == HOST]
    return dict(host)


async def test_a_draining_host_finishes_what_it_holds_and_takes_nothing_new_until_undrained(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given: a task running on the only host
    running = (await client.post("/jobs", json={"command": "sleep 1"})).json()["id"]
    await events.wait_key(f"task.on_cpu.{running}")

    # when: an operator drains it, and a job is submitted
    response = await client.post(f"/hosts/{HOST}/actions", json={"action": "drain"})
    assert response.status_code == 202, response.text
    await _heartbeat_seen(client)
    waiting = (await client.post("/jobs", json={"command": "echo later"})).json()["id"]

    # then: the running task completes; the new job waits, saying why
    assert (await wait_job(client, events, running))["state"] == "completed"
    job = (await client.get(f"/jobs/{waiting}")).json()
    assert job["counts"] == {"new": 1}, job
    assert job["waiting_on"] == "all 1 host(s) of pool default draining (`vigil hosts undrain`)"
    assert (await _host(client))["draining"]
    assert f"task.setting_up.{waiting}" not in events.routing_keys()

    # and: undrained, the host takes it
    response = await client.post(f"/hosts/{HOST}/actions", json={"action": "undrain"})
    assert response.status_code == 202, response.text
    assert (await wait_job(client, events, waiting))["state"] == "completed"
    again = await client.post(f"/hosts/{HOST}/actions", json={"action": "undrain"})
    assert again.status_code == 409
    assert "vigil hosts" in again.json()["next_step"]
