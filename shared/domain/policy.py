"""A job's failure policy (design §5), as submitted and stored in `jobs.policy`."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.domain.messages import Severity


class Backoff(BaseModel):
    """Exponential backoff with jitter, capped: delay = min(max_s, initial_s * factor**n)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_s: float = Field(default=1.0, gt=0, le=3600)
    factor: float = Field(default=2.0, ge=1, le=10)
    max_s: float = Field(default=300.0, gt=0, le=86400)


class Limits(BaseModel):
    """What one task of the job may use on its host, enforced by its cgroup. None:
    the worker's default (`VIGIL_JOB_MEMORY_MB`, `VIGIL_JOB_CPUS`, `VIGIL_JOB_PIDS`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Memory (and swap) in MiB; a command that goes over is killed by the kernel and fails
    #: with class `limit`.
    memory_mb: int | None = Field(default=None, ge=4, le=64 * 1024 * 1024)
    #: Whether a task whose command exits 0 although the kernel killed one of its processes
    #: for going over `memory_mb` completes; by default it fails with class `limit` (what the
    #: killed process was to make may be missing from its results).
    tolerate_oom_kills: bool = False
    #: CPU time, in CPUs (0.5: half of one); a command is slowed, never killed, by it.
    cpus: float | None = Field(default=None, ge=0.01, le=4096)
    #: Processes and threads at once; past it, forks fail inside the command.
    pids: int | None = Field(default=None, ge=8, le=4_194_304)


class Policy(BaseModel):
    """What to do when a task of the job fails; every field has the default of design §5."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    restartable: bool = False
    max_infra_retries: int = Field(default=3, ge=0, le=100)
    max_app_retries: int = Field(default=0, ge=0, le=100)
    retry_exit_codes: list[int] = Field(default_factory=list, max_length=64)
    retry_signals: list[int] = Field(default_factory=list, max_length=64)
    backoff: Backoff = Field(default_factory=Backoff)
    hang_timeout: float | None = Field(default=None, gt=0, le=30 * 86400)
    walltime: float | None = Field(default=None, gt=0, le=365 * 86400)
    fail_on_log: list[Severity] = Field(
        default_factory=lambda: [Severity.ERROR, Severity.CRITICAL, Severity.FATAL]
    )
    fail_fast: bool = False
    #: The job drops to probing (one task in flight) when at least this share of its last
    #: `probe_window` finished tasks failed (and at least half the window has finished);
    #: None never probes.
    probe_failure_rate: float | None = Field(default=0.5, gt=0, le=1)
    probe_window: int = Field(default=10, ge=2, le=1000)
    #: Which analyser decides after a failed attempt (a `vigil.analysers` entry point).
    analyser: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    #: What the command can reach on a confining worker: `none`, a network
    #: namespace of its own with no interface up; `host`, the host's network (operators only:
    #: the services' PostgreSQL, RabbitMQ and Redis are on it).
    network: Literal["none", "host"] = "none"
    #: What one task may use on its host (memory, CPUs, processes).
    limits: Limits = Field(default_factory=Limits)
