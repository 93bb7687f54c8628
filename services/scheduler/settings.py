"""Scheduler settings (`VIGIL_*` environment variables)."""

import shlex

from pydantic import Field

from services.pilot.settings import PilotMargins
from services.scheduler.pilots import PilotPoolSettings, default_pilots_dir
from services.scheduler.triage import TriageSettings
from shared.domain.scheduling.model import Settings
from shared.runtime.config import CommonSettings, FenceSettings, PrefetchSettings


class SchedulerSettings(CommonSettings, FenceSettings, PrefetchSettings, PilotMargins):
    """How often the scheduler looks, how much it does per look, when a host counts as dead."""

    #: The shortest wait of an idle round (`VIGIL_SCHEDULER_TICK_S`): with nothing to do, the
    #: scheduler's rounds wait from this up to the sweep's period, unless woken by a
    #: notification.
    scheduler_tick_s: float = Field(default=0.25, gt=0, le=60)
    #: While tasks wait, the dispatcher looks for what task ends freed five times its last
    #: look's own time after that look, at most this long after it (`VIGIL_RELEASE_GAP_S`,
    #: seconds), or at once when the ends since have freed a tenth of the pool's
    #: CPUs: one look places what all those ends freed. A submission, a full batch or a
    #: triage decision is looked at at once. 0: every end is looked at. With 100 hosts under
    #: load the gap cuts the scheduler's and PostgreSQL's CPU per task by a fifth to a third;
    #: a pool of a few CPUs looks at every end, as without it.
    release_gap_s: float = Field(default=0.1, ge=0, le=10)
    #: Rows one step of the scheduler handles at most (`VIGIL_SCHEDULER_BATCH`): the outbox
    #: rows one read of the relay publishes, the failed tasks one pass of the triage decides,
    #: and as much for the dispatcher's and the waiters' steps.
    scheduler_batch: int = Field(default=500, ge=1, le=10000)
    #: The relay looks for unpublished rows this often while the system is busy (every 2 s
    #: after a quiet spell): the events of a task's normal path on its worker send no NOTIFY
    #: (they would serialize the commits; the worker nudges the relay at most every 0.5 s
    #: instead), so this bounds how late a follower can see them (`VIGIL_RELAY_POLL_S`).
    relay_poll_s: float = Field(default=0.25, gt=0, le=60)
    #: After two busy reads in a row, the relay waits this long before it reads the next,
    #: so that what the system writes meanwhile goes out together (group publish: fewer and
    #: fuller batches, each one statement); after a read that followed a quiet moment,
    #: nothing waits, and work messages or jobs' ends written meanwhile end the wait
    #: (`services/scheduler/gather.py`; `VIGIL_RELAY_GATHER_S`, 0: read again at once).
    relay_gather_s: float = Field(default=0.025, ge=0, le=1)
    #: Quarantine is a circuit breaker (`services/scheduler/breaker.py`): a host with
    #: `quarantine_after` failures blamed on it (lost) within `quarantine_window_s` is shut
    #: (0: never), probes one task at a time after `quarantine_probe_s`, and is shut again
    #: for twice as long after a failed probe, up to `quarantine_s`.
    quarantine_after: int = Field(default=5, ge=0)
    quarantine_window_s: float = Field(default=600.0, gt=0)
    quarantine_s: float = Field(default=600.0, gt=0)
    quarantine_probe_s: float = Field(default=30.0, gt=0)
    #: The logs of a job are deleted this long after it ended (centralised logs' retention).
    log_retention_s: float = Field(default=30 * 86400.0, gt=0)
    #: How often old events and old logs are pruned, and jobs whose `retention_s` ran out
    #: are purged (`VIGIL_PRUNE_EVERY_S`).
    prune_every_s: float = Field(default=60.0, gt=0, le=3600)
    #: The event history (replay, resume: `GET /events?after=`) keeps an event this long
    #: (`VIGIL_EVENT_RETENTION_S`); a reader resuming from before it is told 410 Gone.
    event_retention_s: float = Field(default=7 * 86400.0, gt=0)
    #: The port of `GET /healthz` (`VIGIL_SCHEDULER_HEALTH_PORT`, on `VIGIL_HEALTH_HOST`; 0: none).
    scheduler_health_port: int = Field(default=0, ge=0, le=65535)
    #: The shared pool's policy (`docs/explanation/scheduling.md`, Knobs): usage halves in
    #: this time (`VIGIL_FAIRSHARE_HALF_LIFE_S`; 0: only what is held now counts), a job
    #: gains this many points of priority per hour its oldest task waits
    #: (`VIGIL_PRIORITY_AGE_PER_HOUR`), a request passed over after waiting this long gets a
    #: host held for it (`VIGIL_RESERVE_AFTER_S`), at most this many at once
    #: (`VIGIL_MAX_RESERVATIONS`), and each host is handed the worker's prefetch beyond its
    #: free capacity (`VIGIL_WORKER_PREFETCH`, read by the worker too).
    fairshare_half_life_s: float = Field(default=86400.0, ge=0)
    priority_age_per_hour: float = Field(default=10.0, ge=0)
    reserve_after_s: float = Field(default=600.0, ge=0)
    max_reservations: int = Field(default=4, ge=0)
    #: With no `VIGIL_WORKER_PREFETCH`: tasks handed to a host beyond its free capacity for
    #: users whose commands are short lately (median under `VIGIL_SHORT_TASK_S`): the host's
    #: next task is set up while one runs, and a task placed after them waits little
    #: (`VIGIL_SHORT_PREFETCH`; 0: never).
    short_prefetch: int = Field(default=4, ge=0, le=4096)
    short_task_s: float = Field(default=0.5, gt=0, le=60)
    #: How long a link the store's signer gives a host lasts (`VIGIL_SIGNED_LINK_S`,
    #: `services/scheduler/signer.py`): one request on one object, of a task the host holds.
    #: A host asks again for each request; a multipart upload, for each 16 parts.
    signed_link_s: int = Field(default=300, ge=10, le=7 * 86400)

    def policy(self) -> Settings:
        """The planner's settings."""
        return Settings(
            half_life_s=self.fairshare_half_life_s,
            age_per_hour=self.priority_age_per_hour,
            reserve_after_s=self.reserve_after_s,
            max_reservations=self.max_reservations,
            prefetch=self.worker_prefetch,
        )

    #: Pilots (`docs/how-to/pilots.md`; with `VIGIL_PILOTS_BACKEND`): at most this many
    #: alive (`VIGIL_PILOTS_MAX`), each of `VIGIL_PILOTS_CPUS` CPUs, `VIGIL_PILOTS_MEMORY_MB`
    #: (unset: the batch system's default) and `VIGIL_PILOTS_WALLTIME_S`, cancelled after
    #: `VIGIL_PILOTS_IDLE_S` without a task; their batch jobs' files go to
    #: `VIGIL_PILOTS_DIR` (unset: `~/.vigil/<namespace>/pilots` of the scheduler's user;
    #: `scripts/up` sets `.run/pilots`), made 0700 and checked to be the scheduler's own
    #: (`shared/host/private_dir.py`). Slurm's partition, account and further `sbatch` options
    #: (`VIGIL_SLURM_PARTITION`, `VIGIL_SLURM_ACCOUNT`, `VIGIL_SLURM_OPTIONS`, split as a
    #: shell would); the pilot's drain and stop margins (`VIGIL_PILOT_DRAIN_S`,
    #: `VIGIL_PILOT_STOP_S`) are passed on to it.
    pilots_max: int = Field(default=4, ge=0, le=10000)
    pilots_cpus: int = Field(default=1, ge=1, le=4096)
    pilots_memory_mb: int | None = Field(default=None, ge=1)
    pilots_walltime_s: int = Field(default=3600, ge=60)
    pilots_idle_s: float = Field(default=300.0, ge=0)
    pilots_dir: str = ""
    slurm_partition: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.,-]+$")
    slurm_account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    slurm_options: str = ""

    def triage(self) -> TriageSettings:
        """The triage's settings (and its hosts' breaker's)."""
        return TriageSettings(
            batch=self.scheduler_batch,
            fence_timeout_s=self.fence_timeout_s,
            quarantine_after=self.quarantine_after,
            quarantine_window_s=self.quarantine_window_s,
            quarantine_s=self.quarantine_s,
            quarantine_probe_s=self.quarantine_probe_s,
        )

    def pilots(self) -> PilotPoolSettings:
        """The pilot pool's settings."""
        return PilotPoolSettings(
            backend=self.pilots_backend,
            worker_pool=self.worker_pool,
            most=self.pilots_max,
            idle_s=self.pilots_idle_s,
            cpus=self.pilots_cpus,
            memory_mb=self.pilots_memory_mb,
            walltime_s=self.pilots_walltime_s,
            workdir=self.pilots_dir or str(default_pilots_dir(self.namespace)),
            partition=self.slurm_partition,
            account=self.slurm_account,
            extra=tuple(shlex.split(self.slurm_options)),
            env=self.margins_set(),
        )
