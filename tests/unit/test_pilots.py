"""Pilots, pure: the allocation a pilot reads from Slurm's environment, the
environment of its worker and supervisor, its state from the batch system's, and how many
more pilots the pool asks for."""

import pytest

from services.pilot.allocation import NotInAllocation, from_slurm
from services.pilot.main import child_env
from shared.domain import pilots

START = 1_000_000.0


def test_a_pilot_reads_its_allocation_from_slurms_environment() -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_CPUS_ON_NODE": "4",
        "SLURM_MEM_PER_NODE": "8000",
        "SLURM_JOB_GPUS": "0,1",
    }
    allocation = from_slurm(env, START, walltime_s=90)

    assert allocation.host_id() == "pilot-42"
    assert (allocation.cpus, allocation.memory_mb, allocation.gpu_ids) == (4, 8000, ("0", "1"))
    assert allocation.ends_at == START + 120  # Slurm's --time is in whole minutes
    assert allocation.tasks_end(stop_s=30) == START + 90  # its host's end: the stop margin
    assert allocation.host_env() == {
        "VIGIL_HOST_CPUS": "4",
        "VIGIL_HOST_GPUS": "0,1",
        "VIGIL_HOST_MEMORY_MB": "8000",
    }


def test_without_mem_the_memory_is_unsaid_or_per_cpu_and_gpus_may_come_from_cuda() -> None:
    bare = from_slurm({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "1"}, START, 60)
    per_cpu = from_slurm(
        {
            "SLURM_JOB_ID": "8",
            "SLURM_CPUS_ON_NODE": "2",
            "SLURM_MEM_PER_CPU": "1000",
            "CUDA_VISIBLE_DEVICES": "3",
        },
        START,
        60,
    )

    assert bare.memory_mb is None and "VIGIL_HOST_MEMORY_MB" not in bare.host_env()
    assert bare.host_env()["VIGIL_HOST_GPUS"] == ""  # none: not detected on the node
    assert (per_cpu.memory_mb, per_cpu.gpu_ids) == (2000, ("3",))


def test_outside_a_batch_job_a_pilot_refuses_to_start() -> None:
    with pytest.raises(NotInAllocation, match="SLURM_JOB_ID"):
        from_slurm({}, START, 60)


def test_the_hosts_services_get_its_id_and_capacity_and_no_legacy_slots_nor_store_keys() -> None:
    allocation = from_slurm({"SLURM_JOB_ID": "5", "SLURM_CPUS_ON_NODE": "2"}, START, 60)
    given = {
        "VIGIL_WORKER_SLOTS": "4",
        "VIGIL_DATABASE_URL": "db",
        "VIGIL_WORKER_HEALTH_PORT": "81",
    }
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}  # an operator's sbatch's
    env = child_env(given | keys, allocation, "pilot-5")

    assert "VIGIL_WORKER_SLOTS" not in env
    assert [name for name in env if name.startswith("AWS_")] == []
    assert env["VIGIL_HOST_ID"] == "pilot-5"
    assert env["VIGIL_HOST_CPUS"] == "2"
    assert env["VIGIL_DATABASE_URL"] == "db"
    assert env["VIGIL_WORKER_HEALTH_PORT"] == "0"  # several pilots may share a node


@pytest.mark.parametrize(
    ("batch", "state"),
    [
        ("PENDING", "pending"),
        ("RUNNING", "running"),
        ("COMPLETING", "running"),
        ("CANCELLED", "ended"),
        ("TIMEOUT", "ended"),
        ("NODE_FAIL", "ended"),
        (None, "ended"),  # no longer listed: ended
    ],
)
def test_a_pilots_state_follows_its_batch_jobs(batch: str | None, state: str) -> None:
    assert pilots.state_of(batch) == state


def test_pilots_are_asked_for_as_the_waiting_work_needs_within_the_most_alive() -> None:
    assert pilots.more_needed(0, pilot_cpus=1, starting=0, live=0, most=4) == 0
    assert pilots.more_needed(3, pilot_cpus=1, starting=1, live=1, most=4) == 2
    assert pilots.more_needed(10, pilot_cpus=2, starting=0, live=2, most=4) == 2
    assert pilots.more_needed(1.5, pilot_cpus=4, starting=1, live=1, most=4) == 0


def test_pilots_asked_for_and_not_started_are_withdrawn_beyond_what_waiting_work_needs() -> None:
    assert pilots.surplus(0, pilot_cpus=1, starting=3) == 3  # the job is cancelled: all
    assert pilots.surplus(1.5, pilot_cpus=1, starting=3) == 1  # two still have work
    assert pilots.surplus(8, pilot_cpus=2, starting=3) == 0  # all of them and more
    assert pilots.surplus(-1, pilot_cpus=2, starting=0) == 0
