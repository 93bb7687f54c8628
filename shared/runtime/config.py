"""Settings shared by every service, read from `VIGIL_*` environment variables (design §9).

Nothing is read at import: each service builds its settings once in `main()` and passes them down.
"""

import socket
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.domain.ids import is_safe_id, to_safe_id
from shared.objects import check_store_url


def _check_namespace(value: str) -> str:
    if value and not is_safe_id(value):
        raise ValueError("VIGIL_NAMESPACE must match [a-z0-9][a-z0-9-]* (at most 63 characters)")
    return value


def _check_host_id(value: str) -> str:
    if not is_safe_id(value):
        raise ValueError("VIGIL_HOST_ID must match [a-z0-9][a-z0-9-]* (at most 63 characters)")
    return value


def default_host_id() -> str:
    """The machine's hostname folded into a safe id."""
    return to_safe_id(socket.gethostname())


Namespace = Annotated[str, AfterValidator(_check_namespace)]
HostId = Annotated[str, AfterValidator(_check_host_id)]


#: The worker pool a job runs in unless it names one, and a worker serves unless told.
DEFAULT_POOL: Final = "default"


#: What every `VIGIL_*` variable starts with: a setting `name` is `VIGIL_<NAME>`.
ENV_PREFIX: Final = "VIGIL_"


class VigilSettings(BaseSettings):
    """Read from `VIGIL_*` variables. A variable no model declares is ignored here, and named
    in a warning at the service's start (`shared/runtime/settings_names.py`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")


class CommonSettings(VigilSettings):
    """What every service needs: where the three servers are, and the namespace."""

    #: The PostgreSQL database (a libpq URL).
    database_url: str = "postgresql://postgres@127.0.0.1:5432/test"
    #: The RabbitMQ broker; several nodes of one cluster separated by commas.
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    #: The Redis server (heartbeats, presence, the api's limits).
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: Prefixes the names of exchanges, queues and Redis keys, so that several installations
    #: share the servers ("": none).
    namespace: Namespace = ""
    #: The services' log level (DEBUG, INFO, WARNING, ERROR).
    log_level: str = "INFO"
    #: How long a service waits for in-flight work after SIGTERM before cancelling it.
    graceful_timeout_s: float = Field(default=10.0, gt=0)
    #: The pool of workers that takes the new tasks of this installation (`VIGIL_WORKER_POOL`).
    worker_pool: str = DEFAULT_POOL
    #: Most tasks one user has in flight (claimed or running) over all their jobs; unset: no
    #: cap. Whatever it is, users are interleaved at each release (`VIGIL_MAX_IN_FLIGHT_PER_USER`,
    #: read by the scheduler's rounds and by the api, which releases a job's first tasks).
    max_in_flight_per_user: int | None = Field(default=None, ge=1)
    #: A host whose worker and supervisor have not heartbeated for this long is dead: its
    #: tasks are lost (the scheduler), and it counts as gone (the api's `waiting_on`, health).
    dead_host_s: float = Field(default=10.0, gt=0)
    #: The batch system that pilots are submitted to (`VIGIL_PILOTS_BACKEND`):
    #: `slurm`, or `none` (no pilots; `POST /pilots` refused). The scheduler also asks for
    #: pilots on its own when work waits that no host can take.
    pilots_backend: Literal["none", "slurm"] = "none"
    #: Where the scheduler, the worker and the supervisor serve `GET /healthz`
    #: (`VIGIL_HEALTH_HOST`), each on a port of its own (`VIGIL_SCHEDULER_HEALTH_PORT`,
    #: `VIGIL_WORKER_HEALTH_PORT`, `VIGIL_SUPERVISOR_HEALTH_PORT`; `shared/runtime/health.py`).
    health_host: str = "127.0.0.1"
    #: Where outputs and the files given by reference are kept (`VIGIL_STORE_URL`,
    #: `shared/objects`): `file:///ABS/DIR` (a local or shared directory; `scripts/up` puts it
    #: under its run dir) or `s3://BUCKET/PREFIX`, with `VIGIL_S3_ENDPOINT_URL` for a store
    #: other than AWS and the standard `AWS_*` credentials in the environment of the api and
    #: the scheduler only: a host's requests on an S3 store are signed by the scheduler.
    store_url: Annotated[str, AfterValidator(check_store_url)] = "file:///tmp/vigil-store"
    s3_endpoint_url: str = ""
    #: The most bytes a user keeps in the store (`VIGIL_STORE_QUOTA_BYTES`): their tasks'
    #: outputs and their uploads, until purged; 0: no quota. An operator gives a user a quota
    #: of their own (`vigil users quota`). Past it, jobs that declare outputs and uploads are
    #: refused (409) and a task whose outputs would go over fails, class `quota`. Read by the
    #: api and the worker: give every service the same.
    store_quota_bytes: int = Field(default=0, ge=0, le=2**62)


#: The longest default heartbeat (`HostSettings.heartbeat_s`).
HEARTBEAT_MAX_S: Final = 3.0


def default_heartbeat_s(dead_host_s: float) -> float:
    """A host's heartbeat unless set: a quarter of `dead_host_s`, at most `HEARTBEAT_MAX_S`."""
    return min(HEARTBEAT_MAX_S, dead_host_s / 4)


class FenceSettings(VigilSettings):
    """When a lost task's host is given up on (the scheduler, the worker, the supervisor)."""

    #: The scheduler may resubmit a lost task whose process may still run once its supervisor
    #: killed it, or once its host has been unreachable this long (`VIGIL_FENCE_TIMEOUT_S`):
    #: the supervisor of a host cut off from the database kills its commands after half of it
    #: (self-fencing).
    fence_timeout_s: float = Field(default=60.0, gt=0)


class PrefetchSettings(VigilSettings):
    """How far a host is fed beyond what it can run at once (the scheduler and the worker)."""

    #: Tasks taken beyond what the host can run at once (`VIGIL_WORKER_PREFETCH`): the
    #: scheduler hands each host this many beyond its free capacity, and the worker sets them
    #: up while others run commands, then they wait `queued` for room on this host. It helps
    #: campaigns of short tasks; keep 0 for long tasks over many hosts (a task taken here runs
    #: here, and is failed as lost if this worker dies before it ran).
    worker_prefetch: int = Field(default=0, ge=0, le=4096)


class HostSettings(CommonSettings, FenceSettings):
    """Settings of the two per-host services, worker and supervisor."""

    #: This host's id in `hosts` and in its queues' names (unset: the hostname, folded).
    host_id: HostId = Field(default_factory=default_host_id)
    #: Where tasks' work dirs are made (`VIGIL_WORK_ROOT`).
    work_root: str = "/tmp/vigil-work"
    #: How often the worker and the supervisor beat in `hosts` (`VIGIL_HEARTBEAT_S`). Unset, a
    #: quarter of `dead_host_s`, at most 3 s: four beats within the time after which
    #: a silent host is dead, and each beat one statement of each service. What a beat is
    #: for is a lost host, whose detection takes `dead_host_s` anyway: a dead command or
    #: worker process is seen at once (pidfd), not by beats.
    heartbeat_s: float = Field(default=HEARTBEAT_MAX_S, gt=0)
    #: Whether the worker and the supervisor beat through Redis, for the leading scheduler to
    #: write all hosts' beats in one transaction (`VIGIL_BEATS_THROUGH_REDIS`;
    #: `shared/host/beats.py`). Either way a beat nobody answers goes to PostgreSQL.
    beats_through_redis: bool = True
    #: Where per-command cgroups (v2) go: "" finds a writable cgroup2 mount, "off" uses
    #: process groups only (see shared/host/cgroups.py).
    cgroup_root: str = ""
    #: A command is followed by the supervisor only once it has run this long
    #: (`VIGIL_FOLLOW_AFTER_S`, read by both): the worker hands it over then, and the supervisor
    #: binds its job's error log (and reads the errors already stored). A shorter one costs
    #: neither a hand-over nor a binding: its worker, its parent, sees it exit and reports it,
    #: fails it on its error log, and a worker that dies meanwhile is seen by the supervisor's
    #: watch of the worker and by its reconcile.
    follow_after_s: float = Field(default=0.25, ge=0, le=60)
    #: Every this often (`VIGIL_RECONCILE_S`), the worker compares the tasks PostgreSQL says it
    #: holds with those it drives (`Consumer.reconcile`), and the supervisor PostgreSQL's view
    #: of this host with the processes running.
    reconcile_s: float = Field(default=2.0, gt=0, le=300)

    @model_validator(mode="after")
    def _beat_within_dead_host(self) -> "HostSettings":
        if "heartbeat_s" not in self.model_fields_set:
            self.heartbeat_s = default_heartbeat_s(self.dead_host_s)
        return self
