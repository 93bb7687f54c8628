"""The worker's side of the shared pool (docs/explanation/scheduling.md steps 5 and 6), against
the real PostgreSQL, RabbitMQ and Redis, with real commands (and this host's real cgroups
where it has them): the host's capacity in its `hosts` row, a request it can never hold given
back or failed as the host's, a command's limits from its job's request, and its GPU devices
in its environment."""

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from services.worker.launch import LocalUnconfined
from services.worker.stages import StageRunner
from shared.domain.messages import RunStage
from shared.domain.scheduling.resources import Resources
from shared.host.capacity import HostCapacity
from shared.host.cgroups import Cgroups
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology
from shared.store import db, hosts_repo
from tests.conftest import AMQP_URL, REDIS_URL
from tests.integration.test_cgroup_limits import limiting
from tests.integration.test_stage_runner import _claimed, _runner, _settings, _task

pytestmark = pytest.mark.integration

#: Two CPUs, 1 GiB, two GPU devices.
GPU_HOST = HostCapacity.of(2, 1024, ("0", "1"))

Runner = Callable[..., StageRunner]


@pytest.fixture
async def make_runner(
    pool: db.Pool, session_database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[Runner]:
    """Stage runners of hosts of their own (unconfined), of a capacity the test gives."""
    redis = Redis.from_url(REDIS_URL)
    async with open_broker(AMQP_URL, Topology(namespace), name="test-resources") as broker:

        def make(capacity: HostCapacity, cgroups: Cgroups | None = None) -> StageRunner:
            settings = _settings(session_database_url, namespace, tmp_path)
            launcher = LocalUnconfined(cgroups)
            return _runner(settings, pool, broker, redis, launcher=launcher, capacity=capacity)

        yield make
    await redis.aclose()


async def _asking(pool: db.Pool, command: str, request: Resources, **policy: Any) -> RunStage:
    """Given-step: `_claimed`, its job asking `request` of each task."""
    message = await _claimed(pool, command, **policy)
    await pool.execute(
        "UPDATE jobs SET req_millicpus = $2, req_memory_mb = $3, req_gpus = $4 WHERE id = $1",
        message.job_id,
        request.millicpus,
        request.memory_mb,
        request.gpus,
    )
    return message


async def _run(runner: StageRunner, message: RunStage) -> dict[str, Any]:
    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)
    return await _task(runner.pool, message.task_id)


async def _lines(pool: db.Pool, task_id: str) -> list[str]:
    rows = await pool.fetch("SELECT line FROM logs WHERE task_id = $1 ORDER BY line_no", task_id)
    return [r["line"] for r in rows]


async def test_registration_writes_the_hosts_capacity_and_its_cpus_as_slots(
    pool: db.Pool,
) -> None:
    host = f"h-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        await hosts_repo.register_worker(conn, host, "w-1", "default", Resources.of(2.5, 4096))
        first = await conn.fetchrow("SELECT * FROM hosts WHERE id = $1", host)
        row = await hosts_repo.register_worker(
            conn, host, "w-2", "gpu", GPU_HOST.resources, GPU_HOST.gpu_ids
        )
        again = await conn.fetchrow("SELECT * FROM hosts WHERE id = $1", host)

    assert first is not None and again is not None
    assert (first["capacity_millicpus"], first["capacity_memory_mb"], first["gpu_ids"]) == (
        2500,
        4096,
        [],
    )
    assert first["slots"] == 3  # its CPUs rounded up, for what still shows slots
    assert (again["capacity_millicpus"], again["capacity_memory_mb"], again["gpu_ids"]) == (
        2000,
        1024,
        ["0", "1"],
    )
    assert (again["slots"], again["worker"], again["pool"]) == (2, "w-2", "gpu")
    assert dict(row) == {"quarantined": False, "probing": False, "draining": False}


async def test_a_new_task_asking_more_than_the_host_has_is_given_back_untaken(
    make_runner: Runner, pool: db.Pool
) -> None:
    runner = make_runner(HostCapacity.of(2, 1024))
    message = await _asking(pool, "true", Resources.of(4))

    assert await runner.take(message) is None

    task = await _task(pool, message.task_id)
    assert (task["state"], task["claim"], task["worker"]) == ("new", None, None)
    assert runner.ledger.free == runner.ledger.capacity.resources


async def test_a_task_taken_before_its_host_was_smaller_fails_as_the_hosts_saying_why(
    make_runner: Runner, pool: db.Pool
) -> None:
    runner = make_runner(HostCapacity.of(2, 1024))
    message = await _asking(pool, "true", Resources.of(1))
    held = await runner.take(message)
    assert held is not None
    held.job = replace(held.job, req_memory_mb=4096)  # as the host had when it was taken

    await runner.drive(held)

    task = await _task(pool, message.task_id)
    assert (task["state"], task["failure_class"], task["claim"]) == (
        "failed_on_cluster",
        "host",
        None,
    )
    assert task["error_brief"] == (
        f"cannot run on host {runner.settings.host_id}: it asks for 1 cpu, 4096 MiB, more than"
        " this host's whole capacity (2 cpus, 1024 MiB, no gpu)"
    )


async def test_a_command_sees_the_gpus_its_task_was_placed_with_and_no_other(
    make_runner: Runner, pool: db.Pool
) -> None:
    runner = make_runner(GPU_HOST)
    show = 'echo "[${CUDA_VISIBLE_DEVICES-unset}] [${VIGIL_GPUS-unset}]"'
    placed = await _asking(pool, show, Resources.of(1, 0, 1))
    await pool.execute("UPDATE tasks SET gpu_ids = '{1}' WHERE id = $1", placed.task_id)
    without = await _asking(pool, show, Resources.of(1))

    assert (await _run(runner, placed))["state"] == "completed"
    assert (await _run(runner, without))["state"] == "completed"

    assert await _lines(pool, placed.task_id) == ["[1] [1]"]
    assert await _lines(pool, without.task_id) == ["[] [unset]"]


async def test_a_command_on_a_host_without_gpus_is_told_of_none(
    make_runner: Runner, pool: db.Pool
) -> None:
    show = 'echo "[${CUDA_VISIBLE_DEVICES-unset}] [${VIGIL_GPUS-unset}]"'
    message = await _asking(pool, show, Resources.of(1))

    assert (await _run(make_runner(HostCapacity.of(1, 0)), message))["state"] == "completed"

    assert await _lines(pool, message.task_id) == ["[unset] [unset]"]


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    yield from limiting("memory", "cpu")


def _limit_files(cgroups: Cgroups, task_id: str, claim: uuid.UUID) -> dict[str, Path]:
    """Where the task's cgroups hold its CPU quota and its memory limit (v2, else v1)."""
    v1 = dict(zip(cgroups.v1_roots, cgroups.limiter_paths(task_id, claim), strict=True))
    by_controller = {controller: where for (controller, _), where in v1.items()}

    def file(controller: str, v2: str, v1: str) -> Path:
        if controller in cgroups.v2_controllers:
            return cgroups.path(task_id, claim) / v2
        return by_controller[controller] / v1

    return {
        "cpu": file("cpu", "cpu.max", "cpu.cfs_quota_us"),
        "memory": file("memory", "memory.max", "memory.limit_in_bytes"),
    }


async def test_a_commands_cgroup_limits_its_cpus_and_memory_to_its_jobs_request(
    make_runner: Runner, pool: db.Pool, cgroups: Cgroups
) -> None:
    runner = make_runner(HostCapacity.of(2, 1024), cgroups)
    asks, narrower = Resources.of(0.5, 96), Resources.of(0.25, 512)
    first = await _asking(pool, "placeholder", asks)
    # the job's own memory limit is smaller than what it asks: the smaller wins
    second = await _asking(pool, "placeholder", narrower, limits={"memory_mb": 64})
    for message in (first, second):
        files = _limit_files(cgroups, message.task_id, message.claim)
        command = f"cat {files['cpu']} {files['memory']}"
        await pool.execute("UPDATE jobs SET command = $2 WHERE id = $1", message.job_id, command)

    assert (await _run(runner, first))["state"] == "completed"
    assert (await _run(runner, second))["state"] == "completed"

    v2 = "cpu" in cgroups.v2_controllers
    assert await _lines(pool, first.task_id) == [
        "50000 100000" if v2 else "50000",
        str(96 * 2**20),
    ]
    assert await _lines(pool, second.task_id) == [
        "25000 100000" if v2 else "25000",
        str(64 * 2**20),
    ]
