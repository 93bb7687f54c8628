"""What a batch allocation gives a pilot, read from the batch system's environment (pure)."""

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shared.domain import pilots


class NotInAllocation(Exception):
    """The pilot was not started by a batch system (no job id in its environment)."""


@dataclass(frozen=True)
class Allocation:
    """The batch job a pilot runs as: its id, what it was given, and when it ends."""

    batch_job_id: str
    cpus: float
    memory_mb: int | None  # None: the batch system did not say (no --mem)
    gpu_ids: tuple[str, ...]
    ends_at: float  # epoch seconds

    def host_id(self, prefix: str = "pilot") -> str:
        """The host id of the pilot: derived from the batch job id (one host per job)."""
        return pilots.host_id(self.batch_job_id, prefix)

    def tasks_end(self, stop_s: float) -> float:
        """Until when its host runs tasks (`hosts.ends_at`, what placement measures a task
        against): `stop_s` before the allocation's end, when the pilot stops its worker. Its
        drain, earlier, takes no new task but lets those running go on until then."""
        return self.ends_at - stop_s

    def host_env(self) -> dict[str, str]:
        """The capacity settings of the host's worker (`VIGIL_HOST_*`)."""
        env = {
            "VIGIL_HOST_CPUS": f"{self.cpus:g}",
            "VIGIL_HOST_GPUS": ",".join(self.gpu_ids),
        }
        if self.memory_mb is not None:
            env["VIGIL_HOST_MEMORY_MB"] = str(self.memory_mb)
        return env


def _gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """Slurm's GPUs of the job (`SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES` as it set it)."""
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if value and value != "NoDevFiles":
            return tuple(g.strip() for g in value.split(",") if g.strip())
    return ()


def _memory_mb(env: Mapping[str, str]) -> int | None:
    """`SLURM_MEM_PER_NODE` (MB; set only with `--mem`), or per CPU times the CPUs."""
    if (per_node := env.get("SLURM_MEM_PER_NODE", "").strip()).isdigit():
        return int(per_node)
    per_cpu = env.get("SLURM_MEM_PER_CPU", "").strip()
    cpus = env.get("SLURM_CPUS_ON_NODE", "").strip()
    if per_cpu.isdigit() and cpus.isdigit():
        return int(per_cpu) * int(cpus)
    return None


def from_slurm(env: Mapping[str, str], started_at: float, walltime_s: float) -> Allocation:
    """The allocation of the Slurm job whose environment is `env`, started at `started_at`
    (epoch seconds) for `walltime_s` (Slurm's `--time`, in whole minutes: what the pilot was
    asked for). NotInAllocation outside a Slurm job."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise NotInAllocation("no SLURM_JOB_ID: a pilot runs as a batch job (sbatch)")
    cpus_text = env.get("SLURM_CPUS_ON_NODE") or env.get("SLURM_CPUS_PER_TASK") or "1"
    cpus = float(cpus_text) if re.fullmatch(r"\d+(\.\d+)?", cpus_text) else 1.0
    return Allocation(
        batch_job_id=job_id,
        cpus=max(cpus, 1.0),
        memory_mb=_memory_mb(env),
        gpu_ids=_gpus(env),
        ends_at=started_at + math.ceil(walltime_s / 60) * 60,
    )
