"""Quarantine is a circuit breaker: a one-host pool whose worker died under
its tasks is shut, says so, probes one task at a time, heals, and every job completes."""

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from bench.chaos import leads_group
from shared.host.marks import marked_processes
from tests.e2e.conftest import Events, running_stack, wait_job
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

HOST = "e2e-host"
#: Detection scaled down like the other e2e settings: shut after 3 lost tasks, probe 2 s later.
BREAKER_ENV = E2E_ENV | {
    "VIGIL_QUARANTINE_AFTER": "3",
    "VIGIL_QUARANTINE_PROBE_S": "2",
    "VIGIL_QUARANTINE_S": "8",
}
POLICY = {"restartable": True, "max_infra_retries": 5, "backoff": {"initial_s": 0.2, "max_s": 1}}


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    with running_stack(tmp_path, e2e_namespace, BREAKER_ENV) as s:
        yield s


async def _waiting_jobs(client: httpx.AsyncClient, job_ids: list[str]) -> list[dict[str, Any]]:
    jobs = [(await client.get(f"/jobs/{job_id}")).json() for job_id in job_ids]
    return [j for j in jobs if j["state"] == "active" and j["counts"].get("new", 0)]


async def test_when_the_only_hosts_worker_dies_under_its_tasks__the_breaker_shuts_probes_and_heals(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given: four restartable tasks running on the only host (4 slots), two more waiting
    job_ids = []
    for n in range(3):
        body = {"name": f"q{n}", "command": "sleep 1", "inputs": ["a", "b"], "policy": POLICY}
        response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        job_ids.append(response.json()["id"])

    def on_cpu() -> int:
        return len({b["task_id"] for k, b in events.received if k.startswith("task.on_cpu.")})

    await events.wait_for(lambda _k, _b: on_cpu() >= 4, within=20)

    # when: its worker dies without a word (as under the OOM killer), and comes back
    stack.kill("worker", signal.SIGKILL)
    shut = await events.wait_key(f"host.quarantined.{HOST}", within=20)
    stack.start("worker")

    # then: the host is shut by its breaker, and whoever looks is told why work waits
    assert shut["by"] == "breaker" and "tasks lost" in shut["reason"] and shut["until"]
    waiting = await _waiting_jobs(client, job_ids)
    assert waiting, "the lost tasks' clones wait, new, while the host is shut"
    for job in waiting:
        assert job["waiting_on"].startswith("all 1 host(s) of pool default quarantined"), job
    health = (await client.get("/healthz")).json()
    assert health["status"] == "degraded"
    assert any("quarantined" in reason for reason in health["reasons"]), health

    # and: after its cool-down it probes, one task at a time, and a probe that ends heals it
    probing = await events.wait_key(f"host.probing.{HOST}", within=20)
    released = await events.wait_key(f"host.released.{HOST}", within=30)
    for job_id in job_ids:
        assert (await wait_job(client, events, job_id, within=60))["state"] == "completed"
    conn = await asyncpg.connect(stack.database_url)
    try:
        during = await conn.fetch(
            "SELECT started_at, ended_at FROM attempts WHERE host = $1 AND stage = 'cluster'"
            " AND started_at >= $2 AND started_at < $3"
            " ORDER BY started_at",
            HOST,
            datetime.fromisoformat(probing["sent_at"]),
            datetime.fromisoformat(released["sent_at"]),
        )
    finally:
        await conn.close()
    assert during, "a probe ran"
    for before, after in pairwise(during):
        assert before["ended_at"] <= after["started_at"], f"one task at a time: {during}"
    assert (await client.get("/healthz")).json()["status"] == "ok"
    keys = [k for k in events.routing_keys() if k.startswith("host.")]
    assert keys == [
        f"host.quarantined.{HOST}",
        f"host.probing.{HOST}",
        f"host.released.{HOST}",
    ]


@pytest.fixture
def default_stack(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    """A stack with the default quarantine settings (5 blamed failures in 600 s, 30 s)."""
    env = {k: v for k, v in E2E_ENV.items() if not k.startswith("VIGIL_QUARANTINE")}
    with running_stack(tmp_path, e2e_namespace, env) as s:
        yield s


async def test_twenty_job_processes_killed_by_hand_never_quarantine_the_only_host(
    default_stack: Stack,
) -> None:
    # "One bad minute": kill -9 of job processes (as the OOM killer would) is a
    # signal, the job's record, never the host's (design §5): with the default settings every
    # job completes, and the host is never shut.
    stack = default_stack
    headers = {"Authorization": f"Bearer {stack.token}"}
    policy = POLICY | {"max_infra_retries": 30}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as client:
        job_ids = []
        for n in range(10):
            body = {"name": f"k{n}", "command": "sleep 2", "inputs": ["a", "b", "c"]}
            response = await client.post("/jobs", json=body | {"policy": policy})
            assert response.status_code == 201, response.text
            job_ids.append(response.json()["id"])

        killed = 0
        async with asyncio.timeout(60):
            while killed < 20:
                victims = [
                    m.pid for m in marked_processes(stack.namespace, HOST) if leads_group(m.pid)
                ]
                if victims:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victims[0], signal.SIGKILL)
                        killed += 1
                await asyncio.sleep(0.3)

        async with asyncio.timeout(180):  # within 3 minutes of the last kill
            while True:
                jobs = [(await client.get(f"/jobs/{j}")).json() for j in job_ids]
                if all(job["state"] != "active" for job in jobs):
                    break
                await asyncio.sleep(0.5)
        assert [job["state"] for job in jobs] == ["completed"] * len(jobs)
        [host] = [h for h in (await client.get("/hosts")).json() if h["id"] == HOST]
        assert not host["quarantined"]
        conn = await asyncpg.connect(stack.database_url)
        try:
            signals = await conn.fetchval(
                "SELECT count(*) FROM attempts WHERE failure_class = 'signal'"
            )
            events = await conn.fetchval(
                "SELECT count(*) FROM events WHERE routing_key LIKE 'host.%'"
            )
        finally:
            await conn.close()
        assert signals >= 20 and events == 0
