"""PostgreSQL restarted for real (`pg_ctlcluster ... restart`), idle and under load:
every service rides through on its own, no job is lost, no task pays for it,
and `/healthz` says what it waits for meanwhile."""

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest

from bench.chaos import restart_postgresql
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

POLICY = {"restartable": True, "backoff": {"initial_s": 0.2, "max_s": 1}}


async def _get(client: httpx.AsyncClient, path: str, within: float = 60) -> Any:
    """GET `path` until the api answers 200 (it answers 503 while the database is away)."""
    async with asyncio.timeout(within):
        while True:
            try:
                response = await client.get(path)
                if response.status_code == 200:
                    return response.json()
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)  # polling the API: no event stream survives the restart


async def _ended(client: httpx.AsyncClient, job_ids: list[str], within: float) -> list[Any]:
    async with asyncio.timeout(within):
        while True:
            jobs = [await _get(client, f"/jobs/{job_id}") for job_id in job_ids]
            if all(job["state"] not in ("active", "suspended") for job in jobs):
                return jobs
            await asyncio.sleep(0.5)


async def _failures(stack: Stack) -> list[tuple[str, str | None, str | None]]:
    conn = await asyncpg.connect(stack.database_url)
    try:
        rows = await conn.fetch(
            "SELECT state::text, failure_class::text, error_brief FROM tasks"
            " WHERE failure_class IS NOT NULL ORDER BY updated_at"
        )
    finally:
        await conn.close()
    return [(r["state"], r["failure_class"], r["error_brief"]) for r in rows]


async def _submit(client: httpx.AsyncClient, n: int, command: str, inputs: int) -> list[str]:
    ids = []
    for i in range(n):
        body = {
            "name": f"restart-{i}",
            "command": command,
            "inputs": [str(k) for k in range(inputs)],
            "policy": POLICY,
        }
        response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


async def test_when_postgresql_restarts_idle_then_under_load__every_service_rides_through(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    # idle: the services wait for it, and a job submitted afterwards completes
    await asyncio.to_thread(restart_postgresql)
    [after_idle] = await _submit(client, 1, "echo after", 2)
    assert (await _ended(client, [after_idle], 60))[0]["state"] == "completed"
    assert all(proc.poll() is None for proc in stack.procs.values()), "a service died"

    # under load: 12 jobs of 5 short tasks, 4 slots, restarted while they run
    job_ids = await _submit(client, 12, "sleep 0.2", 5)

    async def running() -> bool:
        return bool((await _get(client, f"/jobs/{job_ids[0]}"))["counts"].get("on_cpu"))

    async with asyncio.timeout(30):
        while not await running():  # noqa: ASYNC110  (polling the API)
            await asyncio.sleep(0.1)
    await asyncio.to_thread(restart_postgresql)

    jobs = await _ended(client, job_ids, 180)
    assert [job["state"] for job in jobs] == ["completed"] * len(jobs)
    failures = await _failures(stack)
    assert not [f for f in failures if f[1] != "platform"], failures  # no job nor host blamed
    assert all(proc.poll() is None for proc in stack.procs.values()), "a service died"
    health = await _get(client, "/healthz")
    assert health["status"] == "ok", health
    print(f"tasks failed by the restart and resubmitted: {len(failures)}")  # noqa: T201
