"""A job's own limits, end to end: a command that goes over its memory limit
is killed by the kernel and the task says so, class `limit`, blamed on the job: not retried
even when restartable, since the same input would go over again."""

import httpx
import pytest

from shared.host.cgroups import Cgroups
from tests.conftest import unavailable
from tests.e2e.conftest import Events, wait_job

pytestmark = pytest.mark.e2e

HOG = "python3 -c 'x = bytearray(256 * 2**20); print(len(x))'"


@pytest.fixture(autouse=True)
def _memory_cgroups(e2e_namespace: str) -> None:
    found = Cgroups.detect(f"{e2e_namespace}-probe")
    if found is None or "memory" not in found.limitable:
        unavailable(
            "no usable memory cgroup controller on this host (not installable: run on a host"
            " whose kernel gives root cgroups, as CI's machine does)"
        )
    for path in (found.root, *(root for _, root in found.v1_roots)):
        path.rmdir()


async def test_a_task_over_its_memory_limit_fails_as_limit_and_is_not_resubmitted(
    client: httpx.AsyncClient, events: Events
) -> None:
    policy = {"limits": {"memory_mb": 64}, "restartable": True, "max_infra_retries": 3}
    answer = await client.post("/jobs", json={"command": HOG, "inputs": ["a"], "policy": policy})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "failed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()  # no clone
    assert (task["state"], task["failure_class"], task["signal"]) == (
        "failed_on_cluster",
        "limit",
        9,
    )
    assert "over the task's memory limit of 64 MiB" in task["error_brief"]


async def test_the_same_command_under_a_higher_limit_completes(
    client: httpx.AsyncClient, events: Events
) -> None:
    body = {"command": HOG, "inputs": ["a"], "policy": {"limits": {"memory_mb": 1024}}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "completed"


#: A process of the task goes over its limit and is killed; the command goes on and exits 0.
HOG_THEN_ON = f"{HOG}\necho 'went on'"


async def test_a_process_killed_over_the_limit_fails_the_task_although_the_command_exits_0(
    client: httpx.AsyncClient, events: Events
) -> None:
    body = {"command": HOG_THEN_ON, "inputs": ["a"], "policy": {"limits": {"memory_mb": 64}}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "failed"
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    task = (await client.get(f"/tasks/{task['id']}")).json()
    assert (task["state"], task["failure_class"], task["exit_code"]) == (
        "failed_on_cluster",
        "limit",
        0,
    )
    assert "over the task's memory limit of 64 MiB" in task["error_brief"]
    assert "the OOM killer ended `python3 -c" in task["error_brief"], task["error_brief"]


async def test_a_job_that_tolerates_oom_kills_completes_when_its_command_exits_0(
    client: httpx.AsyncClient, events: Events
) -> None:
    limits = {"memory_mb": 64, "tolerate_oom_kills": True}
    body = {"command": HOG_THEN_ON, "inputs": ["a"], "policy": {"limits": limits}}
    job_id = (await client.post("/jobs", json=body)).json()["id"]

    job = await wait_job(client, events, job_id)

    assert job["state"] == "completed"
