"""Worker settings (`VIGIL_*` environment variables)."""

from pydantic import Field

from services.worker.confinement import Isolation
from shared.runtime.config import HostSettings


class WorkerSettings(HostSettings):
    """`VIGIL_WORKER_SLOTS` tasks at once on this host, taken from `VIGIL_WORKER_POOL`."""

    worker_slots: int = Field(default=4, ge=1, le=1024)
    #: Tasks taken beyond the slots (`VIGIL_WORKER_PREFETCH`): they are set up while the
    #: slots run commands, then wait `queued` for a slot of this host. It helps campaigns of
    #: short tasks; keep 0 for long tasks over many hosts (a task taken here runs here, and is
    #: failed as lost if this worker dies before it ran).
    worker_prefetch: int = Field(default=0, ge=0, le=4096)
    #: Whether jobs run confined (`services/worker/confinement.py`): `auto` when the worker
    #: is root, `on` (refuse to start otherwise), `off`.
    job_isolation: Isolation = "auto"
    #: A confined job runs as uid and gid `job_uid_base` + its owner's `users.job_uid`.
    job_uid_base: int = Field(default=2_000_000, ge=1000, le=2**31 - 1_000_001)
    #: A task's limits when its job's policy gives none (`VIGIL_JOB_MEMORY_MB`,
    #: `VIGIL_JOB_CPUS`, `VIGIL_JOB_PIDS`; 0: no limit). Memory left unset is 90 % of the
    #: host's: one runaway command is killed before it takes the host (and its worker) down.
    #: They need cgroups (`VIGIL_CGROUP_ROOT`): the worker says at start which it enforces.
    job_memory_mb: int | None = Field(default=None, ge=0, le=64 * 1024 * 1024)
    job_cpus: float = Field(default=0.0, ge=0, le=4096)
    job_pids: int = Field(default=4096, ge=0, le=4_194_304)
    #: Every this often (`VIGIL_RECONCILE_S`, the supervisor's too), compare the tasks
    #: PostgreSQL says this worker holds with those it drives (`Consumer.reconcile`).
    reconcile_s: float = Field(default=2.0, gt=0, le=300)
    #: Log lines are persisted and published in batches this often (seconds).
    log_flush_s: float = Field(default=0.1, gt=0, le=5)
    #: Output files up to this size are kept in PostgreSQL for download from the api
    #: (`VIGIL_OUTPUT_KEEP_BYTES`), as long as a task's kept outputs stay within
    #: `VIGIL_OUTPUT_KEEP_TOTAL_BYTES`; larger ones stay only in the work dir.
    output_keep_bytes: int = Field(default=1024 * 1024, ge=0, le=64 * 1024 * 1024)
    #: A task's run keeps (stores, publishes, writes to its run files) this many bytes of
    #: output lines at most (`VIGIL_LOG_QUOTA_BYTES`); past it one marker line says so, and
    #: the lines after are only read for their severity and progress.
    log_quota_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    output_keep_total_bytes: int = Field(default=16 * 1024 * 1024, ge=0, le=1024 * 1024 * 1024)
    #: The port of `GET /healthz` (`VIGIL_WORKER_HEALTH_PORT`, on `VIGIL_HEALTH_HOST`; 0: none).
    worker_health_port: int = Field(default=0, ge=0, le=65535)
