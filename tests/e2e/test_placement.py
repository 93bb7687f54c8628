"""Placement across hosts: a job's `max_in_flight` holds across every host,
and a host that joins a busy pool takes work."""

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import AMQP_URL, REDIS_URL, fresh_database
from tests.e2e.attempts import cluster_attempts
from tests.e2e.conftest import Events, wait_job
from tests.e2e.own_records import most_at_once, recording, runs
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

HOSTS = ("e2e-p1", "e2e-p2")


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    """Two hosts of 2 slots each; only the first one's worker and supervisor are started (the
    test starts the second's when it needs them)."""
    with fresh_database("vigil_e2e") as url:
        s = Stack(
            database_url=url,
            amqp_url=AMQP_URL,
            redis_url=REDIS_URL,
            namespace=e2e_namespace,
            root=tmp_path,
            hosts=list(HOSTS),
            # 2 CPUs each: the job outgrows one host, so the one that joins has work to take
            extra_env={**E2E_ENV, "VIGIL_WORKER_SLOTS": "2"},
        )
        s.work_root.mkdir(parents=True, exist_ok=True)
        try:
            for name in ("api", "scheduler", f"supervisor@{HOSTS[0]}", f"worker@{HOSTS[0]}"):
                s.start(name)
            s.wait_healthy()
            yield s
        finally:
            s.stop_all()
            s.remove_work_root()
            for name in s.procs:
                print(f"----- {name} -----\n{s.log(name)}")  # noqa: T201


async def test_a_host_that_joins_takes_work_and_max_in_flight_holds_across_hosts(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given: a job of 12 one-second tasks, at most 3 in flight, on one host of 2 slots; each
    # run records its own start and end
    inputs = [str(i) for i in range(12)]
    body = {"command": recording(shared_dir, 1), "inputs": inputs, "max_in_flight": 3}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}")

    # when: a second host joins
    stack.start(f"supervisor@{HOSTS[1]}")
    stack.start(f"worker@{HOSTS[1]}")

    # then: every task completes, the new host ran some, and never more than 3 ran at once
    # (by the runs' own records)
    assert (await wait_job(client, events, job_id, within=60))["state"] == "completed"
    attempts = await cluster_attempts(stack, job_id)
    assert len(attempts) == 12
    assert {a["host"] for a in attempts} == set(HOSTS), "the joining host took work"
    found = runs(shared_dir)
    assert len(found) == 12
    assert most_at_once(found) <= 3, sorted((r.start, r.end) for r in found)
    conn = await asyncpg.connect(stack.database_url)
    try:
        joined = await conn.fetchval("SELECT started_at FROM hosts WHERE id = $1", HOSTS[1])
    finally:
        await conn.close()
    first = min(a["started_at"] for a in attempts if a["host"] == HOSTS[1])
    waited = (first - joined).total_seconds()
    print(f"the joining host's first task started {waited:.2f} s after it registered")  # noqa: T201


async def test_a_jobs_own_files_reach_its_tasks_on_every_host(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given: both hosts up (2 slots each), and a job of 4 tasks that bring their script and
    # hold their slots until the test opens the gate: two run on each host
    stack.start(f"supervisor@{HOSTS[1]}")
    stack.start(f"worker@{HOSTS[1]}")
    stack.wait_healthy()
    gate = shared_dir / "open"
    script = f'#!/bin/bash\nuntil [ -e {gate} ]; do sleep 0.05; done\necho "ran $1"\n'
    body = {
        "command": './run.sh "$VIGIL_INPUT"',
        "inputs": ["a", "b", "c", "d"],
        "files": {
            "run.sh": {"content": base64.b64encode(script.encode()).decode(), "executable": True}
        },
    }
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    # when: all four run at once, then the gate opens
    def running() -> int:
        return len({b["task_id"] for k, b in events.received if k == f"task.on_cpu.{job_id}"})

    async with asyncio.timeout(30), events.changed:
        while running() < 4:
            await events.changed.wait()
    gate.touch()

    # then: each host placed the files and ran its tasks
    assert (await wait_job(client, events, job_id, within=60))["state"] == "completed"
    attempts = await cluster_attempts(stack, job_id)
    assert {a["host"] for a in attempts} == set(HOSTS)
    lines = (await client.get(f"/jobs/{job_id}/logs")).json()["items"]
    assert sorted(item["line"] for item in lines) == ["ran a", "ran b", "ran c", "ran d"]
