"""The `hosts` table: every write to it lives here. A host's row is made by whichever of its
services registers first (worker or supervisor), beaten by both, and its quarantine and drain
are changed by operators and by the scheduler's breaker (`services/scheduler/breaker.py`, whose
rules the breaker statements below spell out).

Locks: each statement takes the row lock of every host row it changes (an upsert, of the row it
inserts or updates), held until the caller's transaction ends; none takes any other.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from asyncpg import Record

from shared.domain.scheduling.resources import Resources
from shared.domain.states import TERMINAL
from shared.store import pilots_repo
from shared.store.attempts_repo import kill_owed_on
from shared.store.db import Connection
from shared.store.pilots_repo import allocation_ended


def in_fleet(hosts: str) -> str:
    """SQL: whether the `hosts` row `hosts` (a table name or alias) is in the fleet that
    `GET /hosts` and the metrics show: not removed by an operator, nor a pilot's whose
    allocation ended."""
    return f"({hosts}.removed_at IS NULL AND NOT {allocation_ended(hosts + '.id')})"


# -- registration and heartbeats ------------------------------------------------------------


async def register_worker(
    conn: Connection,
    host_id: str,
    instance: str,
    pool: str,
    capacity: Resources,
    gpu_ids: Sequence[str] = (),
) -> Record:
    """Make (or take over) the host's row for this worker instance, serving `pool`, with the
    host's capacity as the worker found it (CPUs, memory, GPU devices `gpu_ids`;
    `slots`, its CPUs rounded up, for what still shows slots); the row's admission fields:
    `quarantined`, `probing`, `draining`. A host an operator removed comes back as a new one:
    no longer removed, nor draining by its removal. Locks: the host's row (the upsert's insert
    or update)."""
    row = await conn.fetchrow(
        "INSERT INTO hosts (id, slots, worker, started_at, heartbeat_at, pool,"
        " capacity_millicpus, capacity_memory_mb, gpu_ids)"
        " VALUES ($1, $2, $3, now(), now(), $4, $5, $6, $7::text[])"
        " ON CONFLICT (id) DO UPDATE SET slots = $2, worker = $3, started_at = now(),"
        " heartbeat_at = now(), pool = $4, capacity_millicpus = $5, capacity_memory_mb = $6,"
        " gpu_ids = $7::text[],"
        " draining = hosts.draining AND hosts.removed_at IS NULL,"
        " removed_at = NULL, removed_by = NULL"
        " RETURNING quarantined, probing_since IS NOT NULL AS probing, draining",
        host_id,
        -(-capacity.millicpus // 1000),
        instance,
        pool,
        capacity.millicpus,
        capacity.memory_mb,
        list(gpu_ids),
    )
    assert row is not None  # an upsert returns its row
    return row


async def beat_worker(conn: Connection, host_id: str, instance: str) -> Record | None:
    """The worker's heartbeat, if the host is still this instance's (or no worker's: one
    declared dead takes its place again) and not removed; its admission fields, and `held`:
    how many tasks this instance holds as `tasks_repo.held_by` counts them (a worker holding
    none has nothing to reconcile), or None.
    Locks: the host's row if it matches (its UPDATE)."""
    return await conn.fetchrow(
        "UPDATE hosts SET heartbeat_at = now(), worker = $2"
        " WHERE id = $1 AND (worker = $2 OR worker IS NULL) AND removed_at IS NULL"
        " RETURNING quarantined, probing_since IS NOT NULL AS probing, draining,"
        " (SELECT count(*) FROM tasks WHERE worker = $2 AND claim IS NOT NULL"
        "  AND state <> ALL($3::task_state[])) AS held",
        host_id,
        instance,
        sorted(s.value for s in TERMINAL),
    )


async def forget_worker(conn: Connection, host_id: str, instance: str) -> None:
    """The host has no worker any more (it stopped, or was declared dead), if `instance` was
    still the registered one. Locks: the host's row if it matches (its UPDATE)."""
    await conn.execute(
        "UPDATE hosts SET worker = NULL WHERE id = $1 AND worker = $2", host_id, instance
    )


@dataclass(frozen=True)
class SupervisorBeat:
    """What the supervisor's heartbeat read of its host (its rounds look further
    only where this says there is something to see)."""

    #: The worker instance registered in the row (None: none).
    worker: str | None
    #: Whether that worker's own heartbeat is older than the supervisor's `dead_worker_s`.
    worker_silent: bool
    #: Whether a task of this host is `on_cpu` with a pid (commands to watch).
    running: bool
    #: Whether a task of this host is held by another instance than the registered worker.
    stale_holders: bool
    #: Whether a command of this host is owed a kill (`attempts_repo.kills_owed`).
    kills_owed: bool

    @classmethod
    def unknown(cls) -> "SupervisorBeat":
        """Before the first beat: everything is looked at."""
        return cls(None, False, True, True, True)

    def fields(self) -> list[object]:
        """The fields, in order (what the scheduler answers a beat sent through Redis)."""
        return [self.worker, self.worker_silent, self.running, self.stale_holders, self.kills_owed]


def _supervisor_reads(host: str, dead_worker_s: str, terminal: str) -> str:
    """What a supervisor's beat reads of its host (`SupervisorBeat`), for the host row `hosts`
    of id `host`, its worker silent after `dead_worker_s` and the terminal states `terminal`
    (SQL expressions)."""
    return f"""hosts.worker,
  coalesce(hosts.heartbeat_at < now() - make_interval(secs => {dead_worker_s}), false)
    AS worker_silent,
  EXISTS (SELECT 1 FROM tasks t WHERE t.host = {host} AND t.state = 'on_cpu'
          AND t.claim IS NOT NULL AND t.pid IS NOT NULL) AS running,
  EXISTS (SELECT 1 FROM tasks t WHERE t.host = {host} AND t.state <> ALL({terminal})
          AND t.claim IS NOT NULL AND t.worker IS NOT NULL
          AND t.worker IS DISTINCT FROM hosts.worker) AS stale_holders,
  EXISTS (SELECT 1 FROM attempts a WHERE {kill_owed_on(host)}) AS kills_owed"""


_BEAT_SUPERVISOR: Final = f"""
INSERT INTO hosts (id, slots, supervisor, supervisor_heartbeat_at) VALUES ($1, 0, $2, now())
ON CONFLICT (id) DO UPDATE SET supervisor = $2, supervisor_heartbeat_at = now()
RETURNING {_supervisor_reads("$1", "$3", "$4::task_state[]")}
"""


async def beat_supervisor(
    conn: Connection, host_id: str, instance: str, dead_worker_s: float
) -> SupervisorBeat:
    """The supervisor's heartbeat (makes the host's row if no worker did yet), and what it
    read of the host in the same statement. Locks: the host's row (the upsert's insert or
    update)."""
    row = await conn.fetchrow(
        _BEAT_SUPERVISOR, host_id, instance, dead_worker_s, sorted(s.value for s in TERMINAL)
    )
    assert row is not None  # an upsert returns its row
    return SupervisorBeat(
        row["worker"], row["worker_silent"], row["running"], row["stale_holders"], row["kills_owed"]
    )


# -- beats written by the leading scheduler (`services/scheduler/beat_relay.py`) -------------


@dataclass(frozen=True)
class RelayedBeat:
    """A service's beat read from Redis, to be written into its host's row: which instance
    sent it, how long ago it reached Redis, and (a supervisor's) its `dead_worker_s`."""

    host_id: str
    instance: str
    age_s: float
    dead_worker_s: float = 0.0


_RELAY_WORKER_BEATS: Final = """
UPDATE hosts SET heartbeat_at = greatest(heartbeat_at, now() - make_interval(secs => b.age))
FROM unnest($1::text[], $2::text[], $3::float8[]) AS b(host, instance, age)
WHERE hosts.id = b.host AND hosts.worker = b.instance
RETURNING hosts.id, quarantined, probing_since IS NOT NULL AS probing, draining,
  (SELECT count(*) FROM tasks WHERE worker = b.instance AND claim IS NOT NULL
   AND state <> ALL($4::task_state[])) AS held
"""

_RELAY_SUPERVISOR_BEATS: Final = f"""
UPDATE hosts SET supervisor_heartbeat_at =
  greatest(supervisor_heartbeat_at, now() - make_interval(secs => b.age))
FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[])
  AS b(host, instance, age, dead_worker_s)
WHERE hosts.id = b.host AND hosts.supervisor = b.instance
RETURNING hosts.id, {_supervisor_reads("hosts.id", "b.dead_worker_s", "$5::task_state[]")}
"""


@dataclass(frozen=True)
class WorkerBeat:
    """What the worker's beat reads of its host (`beat_worker`'s fields)."""

    quarantined: bool
    probing: bool
    draining: bool
    #: How many tasks the worker's instance holds (`tasks_repo.held_by`).
    held: int

    def fields(self) -> list[object]:
        """The fields, in order (what the scheduler answers a beat sent through Redis)."""
        return [self.quarantined, self.probing, self.draining, self.held]


async def relay_worker_beats(
    conn: Connection, beats: Sequence[RelayedBeat]
) -> dict[str, WorkerBeat]:
    """Workers' beats, each dated when it reached Redis (never earlier than the row already
    says), into the rows that still name their instance: a worker declared dead or stopped
    takes its place again only by a beat of its own (`beat_worker`). By host: what
    `beat_worker` reads (admission fields and `held`). Locks: those hosts' rows (its UPDATE)."""
    if not beats:
        return {}
    rows = await conn.fetch(
        _RELAY_WORKER_BEATS,
        [b.host_id for b in beats],
        [b.instance for b in beats],
        [b.age_s for b in beats],
        sorted(s.value for s in TERMINAL),
    )
    return {
        row["id"]: WorkerBeat(row["quarantined"], row["probing"], row["draining"], row["held"])
        for row in rows
    }


async def relay_supervisor_beats(
    conn: Connection, beats: Sequence[RelayedBeat]
) -> dict[str, SupervisorBeat]:
    """Supervisors' beats, as `relay_worker_beats` writes workers' (into rows that still name
    their instance; a new supervisor's first beat is its own, `beat_supervisor`). By host:
    what `beat_supervisor` reads. Locks: those hosts' rows (its UPDATE)."""
    if not beats:
        return {}
    rows = await conn.fetch(
        _RELAY_SUPERVISOR_BEATS,
        [b.host_id for b in beats],
        [b.instance for b in beats],
        [b.age_s for b in beats],
        [b.dead_worker_s for b in beats],
        sorted(s.value for s in TERMINAL),
    )
    return {
        row["id"]: SupervisorBeat(
            row["worker"],
            row["worker_silent"],
            row["running"],
            row["stale_holders"],
            row["kills_owed"],
        )
        for row in rows
    }


async def prepare_pilot(conn: Connection, host_id: str, pool: str, ends_at: float) -> None:
    """A pilot's host: its row made (or taken over), not draining, with when it
    stops running tasks (`ends_at`, epoch seconds: its stop margin before the allocation's
    end), before its worker registers. Locks: the host's
    row (the upsert's insert or update)."""
    await conn.execute(
        "INSERT INTO hosts (id, slots, pool, ends_at) VALUES ($1, 0, $2, to_timestamp($3))"
        " ON CONFLICT (id) DO UPDATE SET pool = $2, ends_at = to_timestamp($3), draining = false",
        host_id,
        pool,
        ends_at,
    )


# -- operators: quarantine and drain --------------------------------------------------------


async def quarantine(
    conn: Connection, host_id: str, duration_s: float, reason: str
) -> datetime | None:
    """An operator's quarantine for `duration_s` (not a breaker: it ends a breaker's state);
    when it runs out, or None if there is no such host. Locks: the host's row (its UPDATE)."""
    until: datetime | None = await conn.fetchval(
        "UPDATE hosts SET quarantined = true,"
        " quarantined_until = now() + make_interval(secs => $2), quarantine_reason = $3,"
        " breaker = false, probing_since = NULL, cooldown_s = NULL"
        " WHERE id = $1 RETURNING quarantined_until",
        host_id,
        duration_s,
        reason,
    )
    return until


async def release(conn: Connection, host_id: str) -> bool:
    """End the host's quarantine, an operator's or a breaker's; False if it was not
    quarantined (or there is no such host). Locks: the host's row if quarantined (its
    UPDATE)."""
    status = await conn.execute(
        "UPDATE hosts SET quarantined = false, quarantined_until = now(),"
        " quarantine_reason = NULL, breaker = false, probing_since = NULL, cooldown_s = NULL"
        " WHERE id = $1 AND quarantined",
        host_id,
    )
    return bool(status != "UPDATE 0")


async def drain(conn: Connection, host_id: str) -> bool:
    """Drain the host (a no-op if it drains already); False if there is no such host.
    Locks: the host's row (its UPDATE)."""
    return bool(
        await conn.fetchval("UPDATE hosts SET draining = true WHERE id = $1 RETURNING id", host_id)
    )


async def undrain(conn: Connection, host_id: str) -> bool:
    """Let a draining host take new tasks again; False if it was not draining. Locks: the
    host's row if draining (its UPDATE)."""
    status = await conn.execute(
        "UPDATE hosts SET draining = false WHERE id = $1 AND draining", host_id
    )
    return bool(status != "UPDATE 0")


# -- the breaker (services/scheduler/breaker.py) ----------------------------------------------

_TRIP = """
UPDATE hosts h SET quarantined = true, breaker = true, probing_since = NULL,
    cooldown_s = $3, quarantined_until = now() + make_interval(secs => $3),
    quarantine_reason = $2 || ' tasks lost within ' || $4::text || ' s'
WHERE h.id = $1 AND NOT h.quarantined AND $2 <= (SELECT count(*) FROM attempts a
    WHERE a.host = $1 AND a.failure_class::text = ANY($5::text[])
      AND a.ended_at > greatest(now() - make_interval(secs => $4),
                                  coalesce(h.quarantined_until, '-infinity')))
RETURNING h.id, h.quarantined_until, h.quarantine_reason
"""

#: Shut breakers whose cool-down has passed let one task through.
_TO_PROBING = """
UPDATE hosts SET probing_since = now()
WHERE breaker AND quarantined AND probing_since IS NULL AND quarantined_until <= now()
RETURNING id, quarantined_until, quarantine_reason
"""

#: A probe failed: an attempt started there since probing began is blamed on the host.
_PROBE_FAILED = """
UPDATE hosts h SET probing_since = NULL, cooldown_s = least(h.cooldown_s * 2, $2),
    quarantined_until = now() + make_interval(secs => least(h.cooldown_s * 2, $2)),
    quarantine_reason = 'probe failed (' || f.failure_class::text || '): '
        || coalesce(f.error_brief, 'no detail')
FROM hosts o CROSS JOIN LATERAL (
    SELECT a.failure_class, a.error_brief FROM attempts a
    WHERE a.host = o.id AND a.started_at >= o.probing_since
      AND a.failure_class::text = ANY($1::text[])
    ORDER BY a.started_at LIMIT 1) f
WHERE h.id = o.id AND o.breaker AND o.probing_since IS NOT NULL
RETURNING h.id, h.quarantined_until, h.quarantine_reason
"""

#: A probe succeeded: a command started there since probing began ended (its cluster or
#: post-processing stage; a setup alone proves little), not blamed on the host (a program's
#: own failure proves the host runs programs). Failures before now no longer count towards
#: the next trip (`quarantined_until` marks the end).
_PROBE_PASSED = """
UPDATE hosts h SET quarantined = false, breaker = false, probing_since = NULL,
    cooldown_s = NULL, quarantined_until = now(), quarantine_reason = NULL
WHERE h.breaker AND h.probing_since IS NOT NULL AND EXISTS (SELECT 1 FROM attempts a
    WHERE a.host = h.id AND a.started_at >= h.probing_since AND a.ended_at IS NOT NULL
      AND a.stage IN ('cluster', 'post_processing')
      AND (a.failure_class IS NULL OR a.failure_class::text <> ALL($1::text[])))
RETURNING h.id, NULL::timestamptz AS quarantined_until, 'a probe task ran' AS quarantine_reason
"""

#: An operator's quarantine that has run out.
_RUN_OUT = """
UPDATE hosts SET quarantined = false, quarantine_reason = NULL
WHERE quarantined AND NOT breaker AND quarantined_until <= now()
RETURNING id, NULL::timestamptz AS quarantined_until, 'its quarantine ran out' AS quarantine_reason
"""


async def trip(
    conn: Connection,
    host_id: str,
    after: int,
    cooldown_s: float,
    window_s: float,
    blamed: list[str],
) -> Record | None:
    """Shut the host if it has `after` failures of a `blamed` class within `window_s` (and is
    not quarantined): its id, `quarantined_until` and `quarantine_reason`, or None. Locks: the
    host's row if it trips (its UPDATE); the attempts it counts are read, not locked."""
    return await conn.fetchrow(_TRIP, host_id, after, cooldown_s, window_s, blamed)


async def fail_probes(conn: Connection, blamed: list[str], max_cooldown_s: float) -> list[Record]:
    """Shut again every probing host where an attempt started since is blamed on it, its
    cool-down doubled within `max_cooldown_s`: the hosts changed. Locks: the row of each host
    it shuts (its UPDATE, in no set order); the attempts are read, not locked."""
    return list(await conn.fetch(_PROBE_FAILED, blamed, max_cooldown_s))


async def pass_probes(conn: Connection, blamed: list[str]) -> list[Record]:
    """Close the breaker of every probing host where a command started since ended, not
    blamed on it: the hosts changed. Locks: the row of each host it closes (its UPDATE, in no
    set order); the attempts are read, not locked."""
    return list(await conn.fetch(_PROBE_PASSED, blamed))


async def start_probes(conn: Connection) -> list[Record]:
    """Let one task through every shut breaker whose cool-down has passed: the hosts.
    Locks: the row of each host it changes (its UPDATE, in no set order)."""
    return list(await conn.fetch(_TO_PROBING))


async def end_run_out(conn: Connection) -> list[Record]:
    """End every operator's quarantine that has run out: the hosts. Locks: the row of each
    host it changes (its UPDATE, in no set order)."""
    return list(await conn.fetch(_RUN_OUT))


# -- operators: removal (`shared/operations/host_removal.py`) ----------------------------------


@dataclass(frozen=True)
class Standing:
    """What an operator's removal weighs of a host, read under its row lock."""

    #: Its worker instance registered (None: none).
    worker: str | None
    #: Its worker registered and it or its supervisor beating within the dead-host time.
    alive: bool
    #: Whether an operator removed it already (and no worker registered since).
    removed: bool


async def lock_standing(conn: Connection, host_id: str, dead_after_s: float) -> Standing | None:
    """The host's standing, its row locked until the caller's transaction ends; None if there
    is no such host. Locks: the host's row (FOR UPDATE)."""
    row = await conn.fetchrow(
        "SELECT worker, removed_at IS NOT NULL AS removed, worker IS NOT NULL AND ("
        " heartbeat_at >= now() - make_interval(secs => $2)"
        " OR supervisor_heartbeat_at >= now() - make_interval(secs => $2)) AS alive"
        " FROM hosts WHERE id = $1 FOR UPDATE",
        host_id,
        dead_after_s,
    )
    if row is None:
        return None
    return Standing(row["worker"], bool(row["alive"]), bool(row["removed"]))


async def remove(conn: Connection, host_id: str, actor: str) -> bool:
    """Mark the host removed by `actor` (compare-and-set: False if it was already): no worker
    registered, draining (it takes no work), until a worker registers under its id again.
    Locks: the host's row (its UPDATE)."""
    status = await conn.execute(
        "UPDATE hosts SET removed_at = now(), removed_by = $2, worker = NULL, draining = true"
        " WHERE id = $1 AND removed_at IS NULL",
        host_id,
        actor,
    )
    return bool(status != "UPDATE 0")


async def is_removed(conn: Connection, host_id: str) -> bool:
    """Whether an operator removed the host (and no worker registered under its id since)."""
    found = await conn.fetchval(
        "SELECT 1 FROM hosts WHERE id = $1 AND removed_at IS NOT NULL", host_id
    )
    return found is not None


#: Whether the queues of host `h` are deleted and it has not come back since: a host that
#: comes back has a worker registered (at once, whatever the clocks of the two transactions),
#: then beats newer than the deletion.
_RETIRED: Final = """
h.worker IS NULL AND h.queues_deleted_at IS NOT NULL
AND h.queues_deleted_at >= greatest(h.heartbeat_at, h.supervisor_heartbeat_at)
"""


async def queues_retired(conn: Connection, host_id: str) -> bool:
    """Whether `host_id`'s queues are deleted and it has not come back (no lock)."""
    found = await conn.fetchval(f"SELECT 1 FROM hosts h WHERE h.id = $1 AND {_RETIRED}", host_id)
    return found is not None


async def lock_queues_due(conn: Connection, dead_after_s: float, limit: int) -> list[str]:
    """Up to `limit` dead hosts gone for good (a pilot's whose allocation ended, or one an
    operator removed; neither its worker nor its supervisor has beaten for `dead_after_s`)
    whose queues are not deleted yet
    and that no unended task claims, by id. Locks: their rows (`FOR UPDATE`, skipping those
    held), until the caller's transaction ends, while their queues are deleted
    (`mark_queues_deleted`): a worker registering under the same id waits."""
    rows = await conn.fetch(
        f"""
SELECT h.id FROM hosts h
WHERE h.worker IS NULL AND (h.removed_at IS NOT NULL OR {pilots_repo.allocation_ended("h.id")})
  AND h.heartbeat_at < now() - make_interval(secs => $1)
  AND (h.supervisor_heartbeat_at IS NULL
       OR h.supervisor_heartbeat_at < now() - make_interval(secs => $1))
  AND NOT ({_RETIRED})
  AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.host = h.id AND t.claim IS NOT NULL
                  AND t.state <> ALL($2::task_state[]))
ORDER BY h.id LIMIT $3
FOR UPDATE OF h SKIP LOCKED
""",
        dead_after_s,
        sorted(s.value for s in TERMINAL),
        limit,
    )
    return [row["id"] for row in rows]


async def mark_queues_deleted(conn: Connection, host_id: str) -> None:
    """Record that the host's work and supervise queues were deleted (it is retired until its
    worker registers again). Locks: the host's row (its UPDATE)."""
    await conn.execute("UPDATE hosts SET queues_deleted_at = now() WHERE id = $1", host_id)
