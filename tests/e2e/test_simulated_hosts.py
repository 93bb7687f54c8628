"""Simulated hosts (`bench/simhosts`) beside a real one, against the real services:
the work of one job is spread over both and every task completes, and a cancelled job's
simulated commands are killed on the supervisor's order, as real ones are."""

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import httpx

from bench.cluster import ROOT
from tests.e2e.broker_queues import exchanges_of, queues_of
from tests.e2e.conftest import HOST_ID, Events, wait_job
from tests.e2e.stack import Stack

#: How long the simulator may take to register its hosts.
READY_WITHIN_S = 60
#: The simulated pool whose start and stop must leave the broker as it found it.
SIM_POOL = 100


@contextmanager
def simulator(
    stack: Stack, duration: str, hosts: int = 3, stop: int = signal.SIGTERM
) -> Iterator[list[str]]:
    """Simulated hosts against `stack`, stopped by the signal `stop`; yields their ids, then
    the simulator's last lines."""
    prefix = f"sim{uuid.uuid4().hex[:6]}"
    args = ["--hosts", str(hosts), "--cpus", "2", "--duration", duration, "--prefix", prefix]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.simhosts", *args, "--work-root", str(stack.root / prefix)],
        env=stack._env(None, 0),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    said: list[str] = [proc.stdout.readline()]
    assert said[0].startswith(f"ready {hosts} hosts"), said
    try:
        yield said
    finally:
        proc.send_signal(stop)
        out, _ = proc.communicate(timeout=60)
        said += out.splitlines()


async def _hosts_that_ran(stack: Stack, job_id: str) -> set[str]:
    conn = await asyncpg.connect(stack.database_url)
    try:
        rows = await conn.fetch(
            "SELECT DISTINCT a.host FROM attempts a JOIN tasks t ON t.id = a.task_id"
            " WHERE t.job_id = $1 AND a.stage = 'cluster'",
            job_id,
        )
    finally:
        await conn.close()
    return {r["host"] for r in rows}


async def _unreaped_on_simulated_hosts(stack: Stack, job_id: str) -> int:
    """The job's commands on simulated hosts not yet known gone (`attempts.reaped_at`)."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id"
                " WHERE t.job_id = $1 AND a.stage = 'cluster' AND a.host LIKE 'sim%'"
                " AND a.reaped_at IS NULL",
                job_id,
            )
        )
    finally:
        await conn.close()


async def test_a_job_spreads_over_real_and_simulated_hosts_and_completes(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    with simulator(stack, "fixed:0.2"):
        body = {"name": "mixed", "command": "sleep 0.2", "inputs": [str(i) for i in range(40)]}
        response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        job = await wait_job(client, events, response.json()["id"], within=120)
    assert (job["state"], job["counts"]) == ("completed", {"completed": 40})
    ran_on = await _hosts_that_ran(stack, job["id"])
    assert HOST_ID in ran_on
    assert any(host.startswith("sim") for host in ran_on), ran_on


async def test_a_cancelled_jobs_simulated_commands_are_killed(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    with simulator(stack, "fixed:600", hosts=2) as said:
        body = {"name": "long", "command": "sleep 600", "inputs": [str(i) for i in range(6)]}
        response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        async with asyncio.timeout(60):  # until a simulated host runs one of them
            while not any(h.startswith("sim") for h in await _hosts_that_ran(stack, job_id)):  # noqa: ASYNC110  (where a task runs is no event: read in the database)
                await asyncio.sleep(0.2)
        cancel = await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})
        assert cancel.status_code == 202, cancel.text
        await events.wait_key(f"job.cancelled.{job_id}")
        async with asyncio.timeout(60):  # until the simulated commands are killed and reaped
            while await _unreaped_on_simulated_hosts(stack, job_id):  # noqa: ASYNC110  (a reap is no event: read in the database)
                await asyncio.sleep(0.2)
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert job["state"] == "cancelled" and set(job["counts"]) == {"terminated"}, job
    killed = [line for line in said if line.startswith("stopped:")]
    assert killed and not killed[0].startswith("stopped: 0 "), said


def test_a_simulated_pool_started_and_stopped_leaves_the_broker_as_it_found_it(
    stack: Stack,
) -> None:
    before = queues_of(stack.namespace), exchanges_of(stack.namespace)
    with simulator(stack, "fixed:0.2", hosts=SIM_POOL, stop=signal.SIGINT):
        during = queues_of(stack.namespace)
    after = queues_of(stack.namespace), exchanges_of(stack.namespace)

    assert len(during - before[0]) == 2 * SIM_POOL, during - before[0]  # work and supervise
    assert after == before, (after[0] - before[0], after[1] - before[1])
