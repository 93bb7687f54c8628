"""Self-fencing: a host cut off from the database kills its own commands
before the rest of the cluster may run them elsewhere. Both per-host services hold a lease, so
that the fence holds even when one of them is dead: the supervisor's is renewed by its
heartbeat, the worker's by its own.

The scheduler resubmits a lost task whose process may still run only once that process is known
gone, or once its host has been silent in `hosts` for `VIGIL_FENCE_TIMEOUT_S` (triage). A host
behind a broken link hears neither the kill order nor anything else, and its commands would run
on beside their clones. So each holds a lease: each heartbeat that reaches PostgreSQL
renews it, dated when the beat was *sent* (no later than the `now()` PostgreSQL records, whatever
the round trip). When the lease is older than half the fence timeout, the service kills every
command of this host (by cgroup and by `VIGIL_MARK`, so a process never handed over is found
too), and again at every tick while it stays cut off. The other half is the margin for the kill
itself. A command started meanwhile cannot run its script: the gate opens only after its
`on_cpu` is committed, which needs the database. Back online, the host's stale reports are
refused by the claim fences (their tasks were resubmitted under new claims).
"""

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Final

from shared.host.cgroups import Cgroups
from shared.host.marks import Marked, marked_processes
from shared.runtime.config import HostSettings
from shared.runtime.health import Check
from shared.runtime.lifecycle import wait_or_stop

logger = logging.getLogger(__name__)


def fence_after(fence_timeout_s: float) -> float:
    """How old the lease may grow before this host kills its commands: half the time after
    which the scheduler may resubmit them elsewhere."""
    return fence_timeout_s / 2


@dataclass
class Lease:
    """When this service last proved to PostgreSQL that it lives (monotonic seconds: when that
    beat was sent)."""

    renewed_at: float = field(default_factory=time.monotonic)

    def renew(self, sent_at: float) -> None:
        self.renewed_at = max(self.renewed_at, sent_at)

    def age(self) -> float:
        return time.monotonic() - self.renewed_at


#: A lease older than this many heartbeat periods: PostgreSQL has not heard this service lately.
STALE_BEATS: Final = 5


def health(lease: Lease, heartbeat_s: float, fence_timeout_s: float) -> dict[str, Check]:
    """What the lease says of a per-host service (`shared/runtime/health.py`): `database`,
    whether its heartbeats reach PostgreSQL (degraded once none has for `STALE_BEATS`
    periods: its commands run on, but nothing it reports lands), and `fence`, whether the lease
    has lapsed (unavailable: the service kills this host's commands, `fence_if_expired`)."""
    age, limit = lease.age(), fence_after(fence_timeout_s)
    if age <= STALE_BEATS * heartbeat_s:
        database = Check(True, f"last heartbeat landed {age:.1f} s ago")
    else:
        database = Check(False, f"no heartbeat has reached PostgreSQL for {age:.0f} s")
    if age <= limit:
        fence = Check(True, f"lease {age:.1f} s old; this host fences itself at {limit:g} s")
    else:
        fence = Check(
            False,
            f"fenced: cut off from PostgreSQL for {age:.0f} s (over {limit:g} s):"
            " this host's commands are killed",
            "unavailable",
        )
    return {"database": database, "fence": fence}


def kill_all(namespace: str, host_id: str, cgroups: Cgroups | None) -> list[Marked]:
    """SIGKILL every command of this installation on this host; what was found."""
    marked = [m for m in marked_processes(namespace, host_id) if m.pid != os.getpid()]
    for found in marked:
        if cgroups is not None:
            cgroups.kill(found.task_id, found.claim)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(found.pid, signal.SIGKILL)
    return marked


async def guard(
    lease: Lease,
    *,
    namespace: str,
    host_id: str,
    cgroups: Cgroups | None,
    fence_timeout_s: float,
    every_s: float,
    stop: asyncio.Event,
) -> None:
    """Until `stop`: every `every_s`, `fence_if_expired`."""
    while True:
        await asyncio.to_thread(
            fence_if_expired, lease, namespace, host_id, cgroups, fence_timeout_s
        )
        if await wait_or_stop(stop, every_s):
            return


async def guard_host(
    lease: Lease, settings: HostSettings, cgroups: Cgroups | None, stop: asyncio.Event
) -> None:
    """`guard` with a per-host service's settings (its namespace, host, fence timeout and
    heartbeat period)."""
    await guard(
        lease,
        namespace=settings.namespace,
        host_id=settings.host_id,
        cgroups=cgroups,
        fence_timeout_s=settings.fence_timeout_s,
        every_s=settings.heartbeat_s,
        stop=stop,
    )


def fence_if_expired(
    lease: Lease, namespace: str, host_id: str, cgroups: Cgroups | None, fence_timeout_s: float
) -> list[Marked]:
    """Kill this host's commands if the lease is older than `fence_after(fence_timeout_s)`;
    what was killed."""
    age, limit = lease.age(), fence_after(fence_timeout_s)
    if age <= limit:
        return []
    killed = kill_all(namespace, host_id, cgroups)
    if killed:
        tasks = sorted({k.task_id for k in killed})
        logger.error(
            "no contact with the database for %.1f s (fencing after %.1f s): killed %d"
            " process(es) of %d task(s) on this host before they can be run elsewhere: %s",
            age,
            limit,
            len(killed),
            len(tasks),
            ", ".join(tasks[:10]),
        )
    return killed
