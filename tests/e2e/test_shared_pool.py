"""A shared pool on the real services: work is released by free capacity, so a
user who comes later is not queued behind another's backlog; requests are placed where they
fit, GPUs are never shared; every waiting task says why."""

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import unavailable
from tests.e2e.attempts import cluster_attempts
from tests.e2e.conftest import Events, running_stack, wait_job
from tests.e2e.own_records import most_cpus_at_once, recording, runs, shared_devices
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    """One host of 4 CPUs (the legacy `VIGIL_WORKER_SLOTS`) with two GPUs, 0 and 1."""
    # two GPUs set, not detected: the machine that runs the suite has none
    with running_stack(tmp_path, e2e_namespace, {**E2E_ENV, "VIGIL_HOST_GPUS": "0,1"}) as s:
        yield s


async def _user(client: httpx.AsyncClient, stack: Stack, name: str) -> httpx.AsyncClient:
    """A client for a new plain user (made by the stack's operator)."""
    made = await client.post("/admin/users", json={"name": f"{name}-{stack.namespace}"})
    assert made.status_code == 201, made.text
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    return httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10)


async def _submit(client: httpx.AsyncClient, **body: Any) -> str:
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _reason_while_waiting(client: httpx.AsyncClient, task_id: str) -> str | None:
    """The task's waiting reason once the scheduler gave it one (None if it started first)."""
    async with asyncio.timeout(20):
        while True:
            task = (await client.get(f"/tasks/{task_id}")).json()
            why = task.get("waiting_reason")
            if task["state"] != "new" or (why and why["reason"] not in ("pending", "starting")):
                return why["reason"] if task["state"] == "new" and why else None
            await asyncio.sleep(0.1)


async def test_a_user_who_comes_later_runs_next_not_behind_the_others_backlog(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    alice = await _user(client, stack, "alice")
    bob = await _user(client, stack, "bob")
    async with alice, bob:
        # given Alice's 12 tasks of 4 s filling the host's 4 CPUs
        alice_job = await _submit(
            alice, command="sleep 4", inputs=[str(i) for i in range(12)], name="alice"
        )
        async with asyncio.timeout(30), events.changed:
            while (
                len({b["task_id"] for k, b in events.received if k == f"task.on_cpu.{alice_job}"})
                < 4
            ):
                await events.changed.wait()

        # when Bob submits one task
        bob_job = await _submit(bob, command="echo hi", inputs=["x"], name="bob")
        [bob_task] = (await bob.get(f"/jobs/{bob_job}/tasks")).json()

        # then it waits for capacity, saying so, and runs in the next wave: placed with the
        # first of Alice's waiting tasks when her first four end (one look places what the
        # ends of `VIGIL_RELEASE_GAP_S` freed; which of a wave starts first is the host's),
        # never behind her backlog of eight
        assert await _reason_while_waiting(bob, bob_task["id"]) == "resources"
        assert (await wait_job(bob, events, bob_job, within=30))["state"] == "completed"
        bob_started = (await cluster_attempts(stack, bob_job))[0]["started_at"]
        alice_attempts = await cluster_attempts(stack, alice_job)
        assert 4 <= sum(a["started_at"] < bob_started for a in alice_attempts) < 8


async def test_requests_are_placed_where_they_fit_and_each_gpu_task_has_its_own(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given three users' jobs at once, asking 2 CPUs, one GPU (and 1 CPU), and 1 CPU, on the
    # host of 4 CPUs and 2 GPUs: together they ask for more than it holds (fair share runs
    # them side by side); each run records itself
    asks = [({"cpus": 2}, 2, "abcd"), ({"gpus": 1}, 1, "efgh"), ({}, 1, "ijk")]
    users = [await _user(client, stack, name) for name in ("wide", "gpu", "plain")]
    jobs = []
    for user, (resources, cpus, inputs) in zip(users, asks, strict=True):
        command = recording(shared_dir, cpus)
        jobs.append(await _submit(user, command=command, inputs=list(inputs), resources=resources))

    # then each completes
    for job_id in jobs:
        assert (await wait_job(client, events, job_id, within=60))["state"] == "completed"
    for user in users:
        await user.aclose()
    # and, by what the runs themselves recorded: never more CPUs at once than the host has
    # (each run's quota),
    # across all three jobs; no device held by two runs at once; a GPU task sees its own
    # device, a plain one none
    found = runs(shared_dir)
    assert len(found) == 11
    assert most_cpus_at_once(found) <= 4, sorted((r.start, r.end, r.cpus) for r in found)
    assert [r.clashes for r in found if r.clashes] == []
    assert shared_devices(found) == []
    assert len([r for r in found if r.devices]) == 4
    assert {r.gpus for r in found if r.devices} <= {"0", "1"}
    assert {r.gpus for r in found if not r.devices} == {""}
    # and each is held by the kernel to the CPUs its job asked for (the README's quota)
    if any(r.quota is None for r in found):
        unavailable("the runs saw no CPU quota: this host gives no cpu cgroup controller")
    assert [r.name for r in found if r.quota != r.cpus] == [], found


async def test_a_request_no_host_can_hold_waits_saying_so(
    client: httpx.AsyncClient, events: Events
) -> None:
    job_id = await _submit(client, command="true", inputs=["a"], resources={"cpus": 64})
    async with asyncio.timeout(20):
        while True:  # the scheduler's next round says why
            waiting = (await client.get(f"/jobs/{job_id}")).json().get("waiting")
            if waiting is not None and waiting["reason"] != "pending":
                break
            await asyncio.sleep(0.1)
    assert waiting["reason"] == "too_large"
    assert waiting["tasks"] == 1
    assert "no host can ever hold it" in waiting["message"]
