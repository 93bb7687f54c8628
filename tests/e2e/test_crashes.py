"""Processes and workers killed from outside: every task ends in an explained state, fast."""

import os
import signal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest

from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

# at the defaults users get: the worker's CPUs detected, the host breaker on
pytestmark = [pytest.mark.e2e, pytest.mark.defaults]


async def _running_tasks(
    client: httpx.AsyncClient, events: Events, job_id: str, n: int
) -> list[dict[str, Any]]:
    started: set[str] = set()
    for _ in range(n):
        await events.wait_for(
            lambda k, b: k == f"task.on_cpu.{job_id}" and _first_time(b, started), within=20
        )
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert [t["state"] for t in tasks] == ["on_cpu"] * n
    return list(tasks)


def _first_time(body: dict[str, Any], marks: set[str]) -> bool:
    if body["task_id"] in marks:
        return False
    marks.add(body["task_id"])
    return True


async def test_when_a_process_is_killed_from_outside__the_task_fails_as_signal_and_the_job_crashed(
    client: httpx.AsyncClient, events: Events
) -> None:
    job_id = (await client.post("/jobs", json={"command": "sleep 60"})).json()["id"]
    [task] = await _running_tasks(client, events, job_id, 1)

    os.kill(task["pid"], signal.SIGKILL)

    crashed = await events.wait_key(f"job.crashed.{job_id}", within=5)
    assert crashed["task_id"] == task["id"]
    job = await wait_job(client, events, job_id)
    assert job["state"] == "failed"
    after = (await client.get(f"/tasks/{task['id']}")).json()
    assert (after["state"], after["failure_class"], after["signal"]) == (
        "failed_on_cluster",
        "signal",
        signal.SIGKILL,
    )
    assert "SIGKILL" in after["error_brief"]


async def test_when_the_worker_cannot_report__the_supervisor_fails_the_task_and_fences_it(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a running task whose worker is frozen, so it cannot report the exit
    job_id = (await client.post("/jobs", json={"command": "sleep 60"})).json()["id"]
    [task] = await _running_tasks(client, events, job_id, 1)
    worker = stack.procs["worker"]
    worker.send_signal(signal.SIGSTOP)
    try:
        # when the process dies
        os.kill(task["pid"], signal.SIGKILL)
        crashed = await events.wait_key(f"job.crashed.{job_id}", within=5)
    finally:
        worker.send_signal(signal.SIGCONT)

    # then the supervisor judged it, and the worker's late report changed nothing
    assert crashed["task_id"] == task["id"]
    job = await wait_job(client, events, job_id)
    assert job["state"] == "failed"
    after = (await client.get(f"/tasks/{task['id']}")).json()
    assert (after["state"], after["failure_class"]) == ("failed_on_cluster", "signal")
    assert "without its worker reporting" in after["error_brief"]
    failed_events = [k for k in events.routing_keys() if k.startswith("task.failed_on_cluster.")]
    assert failed_events == [f"task.failed_on_cluster.{job_id}"]


async def test_when_the_worker_is_killed__its_processes_are_killed_and_its_tasks_are_lost(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given two running tasks
    body = {"command": "sleep 60", "inputs": ["a", "b"]}
    job_id = (await client.post("/jobs", json=body)).json()["id"]
    tasks = await _running_tasks(client, events, job_id, 2)
    processes = [psutil.Process(t["pid"]) for t in tasks]

    # when the worker dies without a word
    stack.kill("worker", signal.SIGKILL)

    # then both tasks are lost, the job crashed and failed, and no process is left behind
    job = await wait_job(client, events, job_id, within=10)
    assert job["state"] == "failed"
    assert f"job.crashed.{job_id}" in events.routing_keys()
    for task in tasks:
        after = (await client.get(f"/tasks/{task['id']}")).json()
        assert (after["state"], after["failure_class"]) == ("failed_on_cluster", "lost")
        assert after["attempts"][-1]["failure_class"] == "lost"
    _gone, alive = psutil.wait_procs(processes, timeout=5)
    assert alive == []


async def test_when_the_worker_fails_on_a_task__the_task_fails_explained_instead_of_hanging(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given a held task whose job names a task type this worker does not have (it waits for a
    # task that runs until the test lets it end, so it is still new when it is held)
    gate = shared_dir / "go"
    blocker_job = await client.post(
        "/jobs", json={"command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}
    )
    [blocker] = (await client.get(f"/jobs/{blocker_job.json()['id']}/tasks")).json()
    body = {"command": "true", "prerequisites": {"setup": {blocker["id"]: "completed"}}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    hold = await client.post(f"/tasks/{task['id']}/actions", json={"action": "hold"})
    assert hold.status_code == 202, hold.text
    conn = await asyncpg.connect(stack.database_url)
    try:
        await conn.execute("UPDATE jobs SET type = 'vanished' WHERE id = $1", job_id)
    finally:
        await conn.close()

    # when it is released to the worker, and what it waits for ends
    await client.post(f"/tasks/{task['id']}/actions", json={"action": "release"})
    gate.touch()

    # then it fails with the worker's error, not stuck in setting_up
    assert (await wait_job(client, events, job_id))["state"] == "failed"
    after = (await client.get(f"/tasks/{task['id']}")).json()
    assert (after["state"], after["failure_class"]) == ("failed_to_setup", "hook")
    assert "task type 'vanished' is not installed" in after["error_brief"]
    assert "shell" in after["error_detail"]
