"""Why a waiting task waits: one reason per job with tasks left waiting
after a round, with the numbers that say how far it is from running.

The planner makes all but two: `SUSPENDED` and `PREREQUISITES` are decided before it (a
suspended job, or a task whose prerequisites are not met, is not offered to it), and the
caller labels those tasks itself with the same vocabulary.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from shared.domain.scheduling.resources import Resources


class WaitingReason(StrEnum):
    """What `waiting_reason` says, the most binding first (the order the planner checks)."""

    EMERGENCY_STOP = "emergency_stop"  # nothing starts while a stop is in force
    SUSPENDED = "suspended"  # the job is suspended (decided by the caller)
    PREREQUISITES = "prerequisites"  # a prerequisite is not met (decided by the caller)
    NO_HOST = "no_host"  # no host of the pool takes work
    THROTTLED = "throttled"  # the job's max_in_flight
    USER_CAP = "user_cap"  # the user's cap on tasks in flight
    TOO_LARGE = "too_large"  # resources: no host's capacity can ever hold the request
    HOST_ENDS = "host_ends"  # every host that could hold it ends (a pilot) before it would
    RESERVED = "reserved"  # resources: what would hold it is held for a larger request
    RESOURCES = "resources"  # next to run: waits for capacity that holds its request
    FAIR_SHARE = "fair_share"  # other users' tasks come first
    PRIORITY = "priority"  # the same user's jobs of a higher rank come first


def _tasks(count: int) -> str:
    return f"{count} task" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class EmergencyStop:
    reason: ClassVar[WaitingReason] = WaitingReason.EMERGENCY_STOP

    def message(self) -> str:
        return "an emergency stop is in force: nothing starts until it is lifted"


@dataclass(frozen=True)
class Suspended:
    reason: ClassVar[WaitingReason] = WaitingReason.SUSPENDED

    def message(self) -> str:
        return "the job is suspended"


@dataclass(frozen=True)
class Prerequisites:
    reason: ClassVar[WaitingReason] = WaitingReason.PREREQUISITES

    def message(self) -> str:
        return "a prerequisite is not met yet"


@dataclass(frozen=True)
class NoHost:
    reason: ClassVar[WaitingReason] = WaitingReason.NO_HOST
    hosts: int  # known to the pool, none of them accepting work

    def message(self) -> str:
        if not self.hosts:
            return "no host in the pool"
        return (
            f"no host takes work: none of the pool's {self.hosts} (quarantined, draining, silent)"
        )


@dataclass(frozen=True)
class Throttled:
    reason: ClassVar[WaitingReason] = WaitingReason.THROTTLED
    in_flight: int
    limit: int

    def message(self) -> str:
        return f"throttled by its job: {self.in_flight} in flight, max_in_flight {self.limit}"


@dataclass(frozen=True)
class UserCapped:
    reason: ClassVar[WaitingReason] = WaitingReason.USER_CAP
    in_flight: int
    cap: int

    def message(self) -> str:
        return f"the user's cap: {self.in_flight} tasks in flight of at most {self.cap}"


@dataclass(frozen=True)
class TooLarge:
    reason: ClassVar[WaitingReason] = WaitingReason.TOO_LARGE
    needs: Resources
    largest_host: str  # the host that comes closest to holding it
    largest: Resources  # its capacity

    def message(self) -> str:
        return (
            f"no host can ever hold it: needs {self.needs.describe()}; the largest host, "
            f"{self.largest_host}, has {self.largest.describe()}"
        )


@dataclass(frozen=True)
class EndsTooSoon:
    """Every host that could hold it ends before it would (pilots, their allocations'
    ends): it waits for a host that lasts, as a new pilot's may (the pool asks for one when
    `runs_s` fits in its walltime)."""

    reason: ClassVar[WaitingReason] = WaitingReason.HOST_ENDS
    needs: Resources
    #: How long a task runs (its walltime, or what the job's finished tasks took, with a
    #: margin); None: not known, and the task is not restartable.
    runs_s: float | None
    by_walltime: bool  # `runs_s` is its walltime
    last_host: str  # of the hosts that could hold it, the one that ends last
    ends_in_s: float  # when it ends, from now

    def message(self) -> str:
        ends = f"{self.last_host}, the host that lasts longest, ends in {self.ends_in_s:.0f} s"
        if self.runs_s is None:
            return (
                f"needs {self.needs.describe()} on a host that does not end: not restartable,"
                f" no walltime, and no task of its job has finished yet to tell its length;"
                f" {ends}"
            )
        basis = "its walltime" if self.by_walltime else "what its job's finished tasks took"
        return (
            f"waits for a host that lasts: needs {self.needs.describe()} for"
            f" {self.runs_s:.0f} s ({basis}); {ends}"
        )


@dataclass(frozen=True)
class Reserved:
    reason: ClassVar[WaitingReason] = WaitingReason.RESERVED
    needs: Resources
    host_id: str  # a host whose free capacity would hold it
    for_job: str  # the job it is held for

    def message(self) -> str:
        return (
            f"needs {self.needs.describe()}: what would hold it on {self.host_id} is held "
            f"for job {self.for_job}, a larger request that has waited long"
        )


@dataclass(frozen=True)
class WaitsForResources:
    reason: ClassVar[WaitingReason] = WaitingReason.RESOURCES
    needs: Resources
    closest_host: str  # the host that comes closest to holding it now
    closest_free: Resources  # what it has free
    reserved_host: str | None = None  # held for this job, filling as its tasks end

    def message(self) -> str:
        held = f"; {self.reserved_host} is held for it" if self.reserved_host else ""
        return (
            f"next to run, waits for resources: needs {self.needs.describe()}; the closest "
            f"host, {self.closest_host}, has {self.closest_free.describe()} free{held}"
        )


@dataclass(frozen=True)
class FairShare:
    reason: ClassVar[WaitingReason] = WaitingReason.FAIR_SHARE
    ahead: int  # tasks of other users that come before this user's next

    def message(self) -> str:
        return f"fair share: {_tasks(self.ahead)} of other users ahead"


@dataclass(frozen=True)
class Priority:
    reason: ClassVar[WaitingReason] = WaitingReason.PRIORITY
    ahead: int  # tasks of the same user's jobs ranked higher (priority and age)
    others_ahead: int  # and of other users, before this user's next turn

    def message(self) -> str:
        others = f" (and {_tasks(self.others_ahead)} of other users)" if self.others_ahead else ""
        return f"priority: {_tasks(self.ahead)} of the user's higher-ranked jobs ahead{others}"


Wait = (
    EmergencyStop
    | Suspended
    | Prerequisites
    | NoHost
    | Throttled
    | UserCapped
    | TooLarge
    | EndsTooSoon
    | Reserved
    | WaitsForResources
    | FairShare
    | Priority
)


def detail(wait: Wait) -> dict[str, object]:
    """A reason's numbers as JSON (what `job_waits.detail` keeps and the API shows): its
    fields, each amount of resources as `{"cpus", "memory_mb", "gpus"}`."""
    out: dict[str, object] = {}
    for name, value in vars(wait).items():
        if isinstance(value, Resources):
            out[name] = value.as_json()
        else:
            out[name] = value
    return out
