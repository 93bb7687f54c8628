"""What a planning round is given and what it answers.

A round is given the pool's hosts, the jobs that have tasks waiting (one row per job, not per
task: the planner's cost grows with jobs, users and hosts, never with how many tasks wait or
have ever run), their users, and the settings. It answers which tasks go where, what is held
for a large request, and why every other waiting task waits.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from shared.domain.scheduling.reasons import Wait
from shared.domain.scheduling.resources import NOTHING, Resources

#: What a task asks for when its job says nothing ("default 1 cpu").
DEFAULT_REQUEST = Resources.of(cpus=1)


@dataclass(frozen=True)
class HostState:
    """A host as its last heartbeat and the tasks it holds have it."""

    host_id: str
    capacity: Resources
    #: What no task holds (running, or handed to the host and not started); the caller may
    #: be a little behind, so a negative part counts as nothing free.
    free: Resources
    #: The GPU devices no task holds, in the order the host lists them; as many as
    #: `free.gpus` (a GPU is never shared, so the planner hands out devices, not counts).
    free_gpu_ids: tuple[str, ...] = ()
    #: False when quarantined, draining, or silent: the host is known but takes nothing.
    accepting: bool = True
    #: Tasks handed to it beyond its free capacity (the worker's prefetch), not started yet.
    staged: int = 0
    #: When it stops taking work for good (a pilot's allocation ends: its walltime), in the
    #: round's clock; None: never. A task whose walltime would not fit before then is not
    #: placed there.
    ends_at: float | None = None
    #: Per owner, what their staged tasks here hold (those not started yet). A staged task
    #: waits on its host behind every task placed on capacity, so a task of a user whom fair
    #: share serves first may be placed ahead of it (`planner`).
    staged_of: tuple[tuple[str, Resources], ...] = ()
    #: What the tasks placed on it hold beyond its capacity: those placed ahead of staged
    #: tasks, waiting for the next capacity freed.
    ahead: Resources = NOTHING

    def __post_init__(self) -> None:
        if len(self.free_gpu_ids) != max(self.free.gpus, 0):
            raise ValueError(
                f"host {self.host_id}: {self.free.gpus} free gpus but "
                f"{len(self.free_gpu_ids)} free device ids"
            )

    @classmethod
    def idle(cls, host_id: str, capacity: Resources, gpu_ids: tuple[str, ...] = ()) -> "HostState":
        """A host that holds nothing (its devices named `gpu0`... unless given)."""
        ids = gpu_ids or tuple(f"gpu{n}" for n in range(capacity.gpus))
        return cls(host_id, capacity, capacity, ids)


#: The margin on what a job's finished tasks took (their 95th percentile): a task placed by
#: it on a host that ends is given half as long again, and a minute (setup, a slower input).
EXPECTED_FACTOR: Final = 1.5
EXPECTED_EXTRA_S: Final = 60.0


def expected_runtime(took_p95_s: float | None) -> float | None:
    """How long a task of a job without a walltime is expected to run, from the 95th
    percentile of what its finished tasks took (None: none has finished)."""
    if took_p95_s is None:
        return None
    return took_p95_s * EXPECTED_FACTOR + EXPECTED_EXTRA_S


@dataclass(frozen=True)
class JobDemand:
    """One job's waiting tasks, all alike: the planner decides how many go where."""

    job_id: str
    user: str
    #: Tasks ready to go but for this policy (prerequisites met, backoff passed, job active).
    waiting: int
    request: Resources = DEFAULT_REQUEST
    priority: int = 0
    #: When its oldest waiting task began to wait (seconds, the caller's clock).
    waiting_since: float = 0.0
    in_flight: int = 0
    #: The job's throttle (1 while it probes); None: none.
    max_in_flight: int | None = None
    #: How long each task may run (`policy.walltime`); None: not said. A task is placed on a
    #: host that ends (a pilot) only if it ends there: by its walltime, else by `expected_s`.
    walltime_s: float | None = None
    #: Whether its tasks may be handed to a host beyond its free capacity (the prefetch):
    #: the caller says so when they are known to be short, so that staged work delays a
    #: task placed after it by little.
    stageable: bool = True
    #: Without a walltime, how long a task is expected to run: what the job's finished tasks
    #: took (`expected_runtime`); None: none has finished, or no host ends (not asked).
    expected_s: float | None = None
    #: Whether a task lost with its host is run again (`policy.restartable`). One that is not,
    #: with neither a walltime nor `expected_s`, never goes to a host that ends: the end of
    #: the allocation would fail its job.
    restartable: bool = False

    def __post_init__(self) -> None:
        # Every task takes some CPU: a request of nothing would fit anywhere without end,
        # and a reservation's bound (nothing else fits where it is short) relies on it.
        if self.request.millicpus <= 0 or min(self.request.memory_mb, self.request.gpus) < 0:
            raise ValueError(f"job {self.job_id}: a request needs some CPU and no negative part")
        if self.waiting < 0 or self.in_flight < 0:
            raise ValueError(f"job {self.job_id}: negative counts of tasks")


@dataclass(frozen=True)
class UserState:
    """A user as fair share and the per-user cap see them."""

    user: str
    share: float = 1.0
    #: Decayed usage in CPU-seconds (`fairshare.charged`).
    usage: float = 0.0
    #: Tasks in flight over all the user's jobs, and what they hold.
    in_flight: int = 0
    held: Resources = NOTHING
    #: At most this many tasks in flight (`VIGIL_MAX_IN_FLIGHT_PER_USER`); None: no cap.
    cap: int | None = None

    def __post_init__(self) -> None:
        if self.share <= 0:
            raise ValueError(f"user {self.user}: a share must be more than 0")


@dataclass(frozen=True)
class Settings:
    """The policy's knobs (`docs/explanation/scheduling.md` names their settings)."""

    #: Usage halves in this time; 0 keeps no history (only what is held now counts).
    half_life_s: float = 86400.0
    #: Points of priority a job gains per hour its oldest task waits (no starvation).
    age_per_hour: float = 10.0
    #: A request passed over after waiting this long gets a host held for it.
    reserve_after_s: float = 600.0
    #: Hosts held for large requests at once, at most.
    max_reservations: int = 4
    #: Tasks a host may be handed beyond its free capacity (`VIGIL_WORKER_PREFETCH`).
    prefetch: int = 0


@dataclass(frozen=True)
class Round:
    """Everything one planning round looks at."""

    now: float
    hosts: Sequence[HostState]
    jobs: Sequence[JobDemand]
    #: Users not listed have the defaults (`UserState(user)`).
    users: Mapping[str, UserState] = field(default_factory=dict)
    #: Job id -> host id held for it, as the last round's plan left them.
    reservations: Mapping[str, str] = field(default_factory=dict)
    emergency_stop: bool = False


@dataclass(frozen=True)
class Assignment:
    """`count` tasks of a job go to a host (its work queue)."""

    job_id: str
    host_id: str
    count: int
    #: For each task, the GPU devices it alone gets (`CUDA_VISIBLE_DEVICES`); empty tuples
    #: for a job that asks for none.
    gpu_ids: tuple[tuple[str, ...], ...] = ()
    #: Handed beyond the host's free capacity (prefetch): the worker starts them when its
    #: free capacity holds them.
    staged: bool = False


@dataclass(frozen=True)
class Plan:
    """A round's answer."""

    assignments: tuple[Assignment, ...]
    #: For every job with tasks still waiting after this round, why.
    waits: Mapping[str, Wait]
    #: Job id -> host id held for it (give them to the next round).
    reservations: Mapping[str, str]
    #: Each user's level after the round (lower is served first; `fairshare.level`).
    levels: Mapping[str, float]

    def placed(self, job_id: str) -> int:
        """How many of a job's tasks this round hands out (staged ones included)."""
        return sum(a.count for a in self.assignments if a.job_id == job_id)
