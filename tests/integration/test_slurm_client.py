"""The Slurm client (`shared/batch/slurm.py`) against the real one-node Slurm of `scripts/slurm`:
a job runs and completes, one larger than the node pends with Slurm's reason, one
larger in memory is refused, a running one is signalled and cancelled, and a job Slurm does not
know is absent from its answers."""

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.batch.slurm import BatchError, BatchJob, Slurm

pytestmark = pytest.mark.integration

#: A batch script that says it started, answers USR1 (as a pilot draining would) and sleeps.
SCRIPT = """#!/bin/bash
trap 'echo got USR1' USR1
echo "started $VIGIL_PROBE cpus=$SLURM_CPUS_ON_NODE key=${{AWS_SECRET_ACCESS_KEY:-none}}"
sleep {seconds} & wait $!
wait $!
echo done
"""


@pytest.fixture
def slurm(slurm_conf: str) -> Slurm:
    return Slurm(slurm_conf, timeout_s=20)


async def submit(
    slurm: Slurm, where: Path, seconds: float, *, cpus: int = 1, memory_mb: int | None = None
) -> str:
    return await slurm.submit(
        SCRIPT.format(seconds=seconds),
        name="vigil-test",
        cpus=cpus,
        memory_mb=memory_mb,
        walltime_s=60,
        partition=None,
        account=None,
        workdir=str(where),
        output=str(where / "job-%j.out"),
        env={"VIGIL_PROBE": "probe-42"},
        withheld=("AWS_",),
    )


async def until(
    slurm: Slurm, job_id: str, seen: Callable[[BatchJob | None], bool], within: float = 30
) -> BatchJob | None:
    """Poll `jobs` until `seen` holds for what it says of `job_id` (None: not listed)."""
    async with asyncio.timeout(within):
        while True:
            job = (await slurm.jobs([job_id])).get(job_id)
            if seen(job):
                return job
            await asyncio.sleep(0.2)


async def text_of(path: Path, wanted: str, within: float = 10) -> str:
    """The file's text once it holds `wanted`."""
    async with asyncio.timeout(within):
        while True:
            text = await asyncio.to_thread(lambda: path.read_text() if path.exists() else "")
            if wanted in text:
                return text
            await asyncio.sleep(0.1)


async def test_a_job_runs_then_completes(
    slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-submitters-secret")
    job_id = await submit(slurm, tmp_path, 2)

    running = await until(slurm, job_id, lambda job: job is not None and job.state == "RUNNING")
    ended = await until(slurm, job_id, lambda job: job is None or not job.active)

    assert running is not None and running.started_at is not None
    assert running.ends_at is not None and running.time_left_s is not None
    # --time=1: the walltime ends a minute after the start.
    assert (running.ends_at - running.started_at).total_seconds() == 60
    assert 0 < running.time_left_s <= 60
    # Ended jobs stay in squeue -t all for MinJobAge (300 s) on this Slurm.
    assert ended is not None and ended.state == "COMPLETED"
    output = await text_of(tmp_path / f"job-{job_id}.out", "done")
    # The job gets the submitter's environment with `env` over it, less what is withheld,
    # and its CPUs.
    assert "started probe-42 cpus=1 key=none" in output


async def test_more_cpus_than_the_node_has_pends_with_slurms_reason(
    slurm: Slurm, tmp_path: Path
) -> None:
    # sbatch takes it (EnforcePartLimits=NO, Slurm's default) and it waits for ever.
    job_id = await submit(slurm, tmp_path, 1, cpus=(os.cpu_count() or 1) + 1)

    pending = await until(slurm, job_id, lambda job: job is not None and job.reason is not None)
    await slurm.cancel(job_id)
    cancelled = await until(slurm, job_id, lambda job: job is None or not job.active)

    assert pending is not None and pending.state == "PENDING"
    assert pending.reason == "PartitionConfig"
    assert pending.started_at is None and pending.time_left_s is None
    assert cancelled is not None and cancelled.state == "CANCELLED"


async def test_more_memory_than_the_node_has_is_refused(slurm: Slurm, tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="Requested node configuration is not available"):
        await submit(slurm, tmp_path, 1, memory_mb=100_000_000)


async def test_a_running_job_is_signalled_then_cancelled(slurm: Slurm, tmp_path: Path) -> None:
    job_id = await submit(slurm, tmp_path, 300)
    output = tmp_path / f"job-{job_id}.out"
    await until(slurm, job_id, lambda job: job is not None and job.state == "RUNNING")
    await text_of(output, "started")

    await slurm.cancel(job_id, "USR1")
    signalled = await text_of(output, "got USR1")
    await slurm.cancel(job_id)
    cancelled = await until(slurm, job_id, lambda job: job is None or not job.active, within=20)

    # The signal reached the script alone: its sleep went on until the cancel.
    assert "done" not in signalled
    assert cancelled is not None and cancelled.state == "CANCELLED"
    # Cancelling or signalling a job that has ended is no error.
    await slurm.cancel(job_id)
    await slurm.cancel(job_id, "USR1")


async def test_a_job_slurm_does_not_know_is_absent(slurm: Slurm) -> None:
    assert await slurm.jobs([]) == {}
    assert await slurm.jobs(["987654"]) == {}
    assert await slurm.jobs(["987654", "987655"]) == {}
    await slurm.cancel("987654")


async def test_a_missing_command_is_a_batch_error(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="not found"):
        await Slurm(bin_dir=str(tmp_path)).jobs(["1"])
