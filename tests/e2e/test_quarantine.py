"""Quarantine is a circuit breaker (issue 13 point 1): a one-host pool whose worker died under
its tasks is shut, says so, probes one task at a time, heals, and every job completes."""

import signal
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

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
