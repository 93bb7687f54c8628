"""Services stop gracefully on SIGTERM and carry on after a broker restart."""

import asyncio
import signal
import subprocess
from typing import Any

import asyncpg
import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import ADMIN_DATABASE_URL, REDIS_URL
from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e


async def test_when_the_worker_gets_sigterm__running_tasks_finish_and_it_exits_cleanly(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    job_id = (await client.post("/jobs", json={"command": "sleep 1; echo finished"})).json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}")

    stack.procs["worker"].send_signal(signal.SIGTERM)

    job = await wait_job(client, events, job_id)
    assert job["state"] == "completed"
    assert await asyncio.to_thread(stack.procs["worker"].wait, 15) == 0
    assert "drained; 0 task(s) cancelled" in stack.log("worker")


async def test_when_the_worker_stops_with_work_waiting__the_waiting_work_goes_back_to_the_queue(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given more tasks than the worker's 4 slots, 4 of them running
    body = {"command": "sleep 1", "inputs": [str(i) for i in range(6)]}
    job_id = (await client.post("/jobs", json=body)).json()["id"]
    await events.wait_for(lambda _k, _b: events.routing_keys().count(f"task.on_cpu.{job_id}") == 4)

    # when the worker is stopped, then started again
    stack.procs["worker"].send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(stack.procs["worker"].wait, 30) == 0
    started_by_first = events.routing_keys().count(f"task.setting_up.{job_id}")
    stack.start("worker")

    # then the first worker started only what it had slots for, and the rest ran on the second
    assert started_by_first == 4
    job = await wait_job(client, events, job_id)
    assert (job["state"], job["counts"]) == ("completed", {"completed": 6})


async def test_when_sigterm_outlasts_the_graceful_timeout__the_task_is_failed_as_lost(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    job_id = (await client.post("/jobs", json={"command": "sleep 60"})).json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}")

    stack.procs["worker"].send_signal(signal.SIGTERM)

    job = await wait_job(client, events, job_id, within=30)
    assert job["state"] == "failed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert (task["state"], task["failure_class"]) == ("failed_on_cluster", "lost")
    assert "worker stopped" in task["error_brief"]
    assert await asyncio.to_thread(stack.procs["worker"].wait, 15) == 0


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


async def _poll_job(client: httpx.AsyncClient, job_id: str, within: float) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while True:
            job: dict[str, Any] = (await client.get(f"/jobs/{job_id}")).json()
            if job["state"] != "active":
                return job
            await asyncio.sleep(0.2)  # polling the API: no event stream survives the restart


async def test_when_rabbitmq_restarts__the_services_reconnect_and_jobs_still_complete(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    # given a job done before the restart
    first = (await client.post("/jobs", json={"command": "echo before"})).json()["id"]
    assert (await _poll_job(client, first, 30))["state"] == "completed"

    # when the broker restarts
    await asyncio.to_thread(_rabbitmqctl, "stop_app")
    await asyncio.to_thread(_rabbitmqctl, "start_app")
    await asyncio.to_thread(_rabbitmqctl, "await_startup")

    # then every service is still up and a new job runs through
    second = (
        await client.post("/jobs", json={"command": "echo after", "inputs": ["x", "y"]})
    ).json()
    job = await _poll_job(client, second["id"], 60)
    assert job["state"] == "completed"
    assert all(proc.poll() is None for proc in stack.procs.values())


async def _drop_database_and_redis_connections(stack: Stack) -> int:
    """Cut every connection the services hold to PostgreSQL and Redis, as a restart would."""
    conn = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        name = stack.database_url.rsplit("/", 1)[1]
        cut = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1",
            name,
        )
    finally:
        await conn.close()
    client = Redis.from_url(REDIS_URL)
    try:
        await client.client_kill_filter(_type="normal", skipme=True)
    finally:
        await client.aclose()
    return int(cut)


async def test_when_database_and_redis_connections_drop__the_services_reconnect_and_carry_on(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    first = (await client.post("/jobs", json={"command": "echo before"})).json()["id"]
    assert (await wait_job(client, events, first))["state"] == "completed"

    assert await _drop_database_and_redis_connections(stack) > 0

    second = await client.post("/jobs", json={"command": "echo after", "inputs": ["x", "y"]})
    assert second.status_code == 201, second.text
    assert (await wait_job(client, events, second.json()["id"]))["state"] == "completed"
    assert all(proc.poll() is None for proc in stack.procs.values())
