"""Worker settings (`VIGIL_*` environment variables)."""

from pathlib import Path

from pydantic import Field, field_validator

from services.worker.confinement import Isolation
from shared.host import capacity as host_capacity
from shared.runtime.config import HostSettings, PrefetchSettings


class WorkerSettings(HostSettings, PrefetchSettings):
    """Tasks run on this host as far as its capacity holds their requests, taken from
    `VIGIL_WORKER_POOL` and from the host's own queue."""

    #: The host's capacity (`shared/host/capacity.py`): its CPUs
    #: (`VIGIL_HOST_CPUS`, fractions allowed), memory (`VIGIL_HOST_MEMORY_MB`) and GPU devices
    #: (`VIGIL_HOST_GPUS`, ids separated by commas: "0,1"; "": none). Each one unset is
    #: detected (affinity and cgroup `cpu.max`, `/proc/meminfo` and `memory.max`,
    #: `nvidia-smi -L`).
    host_cpus: float | None = Field(default=None, ge=0.01, le=65536)
    host_memory_mb: int | None = Field(default=None, ge=0, le=2**31 - 1)
    host_gpus: str | None = Field(default=None, max_length=4096)
    #: Legacy (`VIGIL_WORKER_SLOTS`): set and `VIGIL_HOST_CPUS` not, the host's CPUs, so
    #: that a deployment that set it runs as many default (1-CPU) tasks at once as before.
    #: Its default (4) counts for nothing: unset, the CPUs are detected.
    worker_slots: int = Field(default=4, ge=1, le=1024)
    #: Whether jobs run confined (`services/worker/confinement.py`): `auto` when the worker
    #: is root, `on` (refuse to start otherwise), `off`.
    job_isolation: Isolation = "auto"
    #: A confined job runs as uid and gid `job_uid_base` + its owner's `users.job_uid`.
    job_uid_base: int = Field(default=2_000_000, ge=1000, le=2**31 - 1_000_001)
    #: The host's claims of uid ranges, one per installation (`shared/host/uid_ranges.py`):
    #: a worker confines only with `job_uid_base` (unset: a free range) its installation
    #: holds on the host (`VIGIL_UID_RANGES_DIR`).
    uid_ranges_dir: str = "/var/lib/vigil/uid-ranges"
    #: What a confined job's room shows of the host beside its work dir (`confinement.py`),
    #: absolute paths separated by commas, each at its own path (a missing one is left out):
    #: `VIGIL_JOB_READ_ONLY_PATHS` read-only (a site's shared data, a software tree under a
    #: hidden dir), `VIGIL_JOB_SCRATCH_PATHS` read-write (a scratch file system; its files
    #: outlive the job and are seen by every job given it).
    job_read_only_paths: str = Field(default="", max_length=65536)
    job_scratch_paths: str = Field(default="", max_length=65536)
    #: The size of a confined command's private /tmp, /var/tmp and /dev/shm, each
    #: (`VIGIL_JOB_TMP_MB`; memory, charged to the command's cgroup where it has one).
    job_tmp_mb: int = Field(default=512, ge=1, le=1024 * 1024)
    #: A task's limits when its job's policy gives none (`VIGIL_JOB_MEMORY_MB`,
    #: `VIGIL_JOB_CPUS`, `VIGIL_JOB_PIDS`; 0: no limit). Memory left unset is 90 % of the
    #: host's: one runaway command is killed before it takes the host (and its worker) down.
    #: They need cgroups (`VIGIL_CGROUP_ROOT`): the worker says at start which it enforces.
    job_memory_mb: int | None = Field(default=None, ge=0, le=64 * 1024 * 1024)
    job_cpus: float = Field(default=0.0, ge=0, le=4096)
    job_pids: int = Field(default=4096, ge=0, le=4_194_304)
    #: Log lines are persisted and published in batches this often (seconds).
    log_flush_s: float = Field(default=0.1, gt=0, le=5)
    #: Output files up to this size are also kept in PostgreSQL, for chained tasks on other
    #: hosts (`VIGIL_OUTPUT_KEEP_BYTES`), as long as a task's kept outputs stay within
    #: `VIGIL_OUTPUT_KEEP_TOTAL_BYTES`; every output, whatever its size, goes to the object
    #: store, where downloads come from.
    output_keep_bytes: int = Field(default=1024 * 1024, ge=0, le=64 * 1024 * 1024)
    output_keep_total_bytes: int = Field(default=16 * 1024 * 1024, ge=0, le=1024 * 1024 * 1024)
    #: How long the worker keeps trying an object store that fails (unreachable, refusing),
    #: with a growing pause, to put a task's outputs or fetch the objects it names, before it
    #: fails the task, class `platform` (`VIGIL_STORE_PATIENCE_S`;
    #: `services/worker/store_patience.py`). Meanwhile the task stays in post-processing (or
    #: setting up), held by this worker.
    store_patience_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)
    #: The most bytes the host's cache of store objects holds (`VIGIL_CACHE_BYTES`, under
    #: `<work root>/.cache`: `shared/host/object_cache.py`): the inputs tasks name by
    #: reference, fetched once per host; the least recently used go first. An object larger
    #: than this is fetched for its task alone; 0 keeps none.
    cache_bytes: int = Field(default=10 * 1024**3, ge=0, le=2**62)
    #: A task's run keeps (stores, publishes, writes to its run files) this many bytes of
    #: output lines at most (`VIGIL_LOG_QUOTA_BYTES`); past it one marker line says so, and
    #: the lines after are only read for their severity and progress.
    log_quota_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    #: The port of `GET /healthz` (`VIGIL_WORKER_HEALTH_PORT`, on `VIGIL_HEALTH_HOST`; 0: none).
    worker_health_port: int = Field(default=0, ge=0, le=65535)

    @field_validator("job_read_only_paths", "job_scratch_paths")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        relative = [path for path in _paths(value) if not path.is_absolute()]
        if relative:
            raise ValueError(f"paths must be absolute: {', '.join(map(str, relative))}")
        return value

    def read_only_paths(self) -> tuple[Path, ...]:
        return _paths(self.job_read_only_paths)

    def scratch_paths(self) -> tuple[Path, ...]:
        return _paths(self.job_scratch_paths)

    def capacity(self) -> host_capacity.HostCapacity:
        """The host's capacity: as set, else detected (at each call: the worker asks once, at
        its start)."""
        return host_capacity.decide(
            self.host_cpus,
            self.host_memory_mb,
            self.host_gpus,
            self.worker_slots if "worker_slots" in self.model_fields_set else None,
        )


def _paths(listed: str) -> tuple[Path, ...]:
    """The paths of a comma list (blanks around each ignored, empty ones left out)."""
    return tuple(Path(part.strip()) for part in listed.split(",") if part.strip())
