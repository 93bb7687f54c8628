"""Whether the worker pool can start tasks, and if not, why: what a job's
`waiting_on` and `/healthz` tell whoever looks, read from `hosts` in one statement."""

from dataclasses import dataclass
from datetime import datetime

from shared.store.db import Connection

_READ = """
SELECT count(*) FILTER (WHERE live) AS live,
       count(*) FILTER (WHERE live AND NOT quarantined AND NOT draining) AS open,
       count(*) FILTER (WHERE live AND draining) AS draining,
       count(*) FILTER (WHERE live AND probing_since IS NOT NULL) AS probing,
       count(*) FILTER (WHERE supervised) AS supervised,
       min(quarantined_until) FILTER (WHERE live AND quarantined) AS shut_until,
       min(quarantine_reason) FILTER (WHERE live AND quarantined) AS reason
FROM (SELECT h.quarantined, h.quarantined_until, h.quarantine_reason, h.probing_since,
             h.draining,
             h.worker IS NOT NULL AND h.heartbeat_at > now() - make_interval(secs => $2) AS live,
             h.supervisor_heartbeat_at > now() - make_interval(secs => $2) AS supervised
      FROM hosts h WHERE h.pool = $1 AND h.removed_at IS NULL) h
"""


@dataclass(frozen=True)
class PoolStatus:
    """The hosts of one pool, as the last heartbeats have them."""

    pool: str
    live: int  # hosts whose worker heartbeated within the dead-host time
    open: int  # of those, taking tasks (not quarantined, not draining)
    probing: int  # of those, letting one task at a time through their breaker
    supervised: int  # hosts whose supervisor heartbeated within the dead-host time
    shut_until: datetime | None  # the first end of a quarantine among the live hosts
    reason: str | None  # one of their quarantine reasons
    draining: int = 0  # live hosts an operator drains (they take no new task)

    def waiting_on(self) -> str | None:
        """Why a new task of this pool cannot start now (None: nothing in the pool stops it)."""
        if self.live == 0:
            return f"no worker of pool {self.pool} has a fresh heartbeat"
        if self.open > 0:
            return None
        if self.draining == self.live:
            return f"all {self.live} host(s) of pool {self.pool} draining (`vigil hosts undrain`)"
        drained = f", {self.draining} draining" if self.draining else ""
        shut = f"all {self.live} host(s) of pool {self.pool} quarantined{drained}"
        if self.probing:
            return f"{shut}; {self.probing} probing, one task at a time"
        until = f" until {self.shut_until.isoformat(timespec='seconds')}" if self.shut_until else ""
        return f"{shut}{until} ({self.reason})" if self.reason else f"{shut}{until}"

    def troubles(self) -> list[str]:
        """What an operator must know about this pool (health: degraded)."""
        found = [self.waiting_on()] if self.live == 0 or not self.open else []
        if self.supervised == 0:
            found.append(f"no supervisor of pool {self.pool} has a fresh heartbeat")
        return [t for t in found if t]


def job_waiting_on(new_tasks: int, probing_since: datetime | None, pool: PoolStatus) -> str | None:
    """Why a job with `new_tasks` waiting to start (of an active or configuring job) does
    not start them at full pace: the pool first, then the job's own probing."""
    if new_tasks == 0:
        return None
    if (why := pool.waiting_on()) is not None:
        return why
    if probing_since is not None:
        since = probing_since.isoformat(timespec="seconds")
        return f"probing since {since}: one task at a time, too many of its recent tasks failed"
    return None


async def read(conn: Connection, pool: str, fresh_s: float) -> PoolStatus:
    """The pool's hosts, a heartbeat counting as fresh for `fresh_s` seconds."""
    row = await conn.fetchrow(_READ, pool, fresh_s)
    assert row is not None  # an aggregate returns one row
    return PoolStatus(
        pool=pool,
        live=row["live"],
        open=row["open"],
        probing=row["probing"],
        supervised=row["supervised"],
        draining=row["draining"],
        shut_until=row["shut_until"],
        reason=row["reason"],
    )
