"""Supervisor settings (`VIGIL_*` environment variables)."""

from pydantic import Field

from services.supervisor.watchers import WatchSettings
from shared.runtime.config import HostSettings


class SupervisorSettings(HostSettings):
    """How long to wait for a worker's own report, and how often to look around."""

    #: After a watched process exits, the worker has this long to report how before we judge.
    report_grace_s: float = Field(default=0.5, gt=0, le=30)
    #: How often to look up which worker process is registered on this host while none is
    #: watched (one is starting); a watched worker's exit is seen at once, and its
    #: registration and heartbeat are looked at every `dead_worker_s` / 10 (or this, if longer).
    worker_poll_s: float = Field(default=0.2, gt=0, le=10)
    #: How often each watcher checks walltime and signs of life (hang_timeout).
    vitals_s: float = Field(default=0.5, gt=0, le=60)
    #: A tree being killed gets SIGTERM, then SIGKILL this long after.
    kill_grace_s: float = Field(default=5.0, ge=0, le=600)
    #: A live worker that has not heartbeated for this long is judged frozen: its processes
    #: are killed and its tasks lost.
    dead_worker_s: float = Field(default=10.0, gt=0)
    #: The port of `GET /healthz` (`VIGIL_SUPERVISOR_HEALTH_PORT`, on `VIGIL_HEALTH_HOST`; 0: none).
    supervisor_health_port: int = Field(default=0, ge=0, le=65535)

    def watch(self) -> WatchSettings:
        """The watchers' settings."""
        return WatchSettings(
            report_grace_s=self.report_grace_s,
            vitals_s=self.vitals_s,
            kill_grace_s=self.kill_grace_s,
            follow_after_s=self.follow_after_s,
        )
