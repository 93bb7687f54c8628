"""The `pilots` table (migration 0039): every write to it lives here.

Operators ask for pilots (`POST /pilots`: rows `requested`) and withdraw them (`DELETE`:
`draining`); the leading scheduler submits the requested ones to the batch system, follows
their batch state, asks for more when work waits that no host can take, and cancels those
idle too long (`services/scheduler/pilots.py`).

Locks: each write takes the row locks of the pilots it changes, until the caller's
transaction ends; reads take none.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.domain.ids import new_ids
from shared.store.db import Connection


def allocation_ended(host_id: str) -> str:
    """SQL: whether the host whose id is `host_id` (an SQL expression) is a pilot's whose
    allocation has ended, as the batch system reported it. The last pilot of that host id
    decides: a batch system started afresh numbers its jobs from 1 again, and a new pilot may
    come up with the id of an old one."""
    return (
        f"(SELECT p.state = 'ended' FROM pilots p WHERE p.host_id = {host_id}"
        " ORDER BY p.created_at DESC LIMIT 1) IS TRUE"
    )


@dataclass(frozen=True)
class Pilot:
    id: str
    pool: str
    backend: str
    state: str
    batch_job_id: str | None
    host_id: str | None
    cpus: int
    memory_mb: int | None
    gpus: int
    walltime_s: int
    reason: str | None
    requested_by: str
    created_at: datetime
    started_at: datetime | None
    ends_at: datetime | None
    ended_at: datetime | None
    idle_since: datetime | None

    @classmethod
    def from_record(cls, row: Any) -> "Pilot":
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Ask:
    """What a pilot is asked for."""

    cpus: int
    walltime_s: int
    memory_mb: int | None = None
    gpus: int = 0


async def request(
    conn: Connection, pool: str, backend: str, ask: Ask, count: int, by: str
) -> list[Pilot]:
    """`count` new pilots of `ask`, `requested` (the scheduler submits them). Locks: none
    beyond the rows it inserts."""
    rows = await conn.fetch(
        "INSERT INTO pilots (id, pool, backend, cpus, memory_mb, gpus, walltime_s,"
        " requested_by) SELECT i, $2, $3, $4, $5, $6, $7, $8 FROM unnest($1::text[]) AS i"
        " RETURNING *",
        new_ids("p", count),
        pool,
        backend,
        ask.cpus,
        ask.memory_mb,
        ask.gpus,
        ask.walltime_s,
        by,
    )
    return [Pilot.from_record(r) for r in rows]


async def listed(conn: Connection, pool: str | None = None, live: bool = False) -> list[Pilot]:
    """The pilots (of `pool`; only those not ended with `live`), newest first (at most 500)."""
    rows = await conn.fetch(
        "SELECT * FROM pilots WHERE ($1::text IS NULL OR pool = $1)"
        " AND (NOT $2 OR state <> 'ended') ORDER BY created_at DESC, id LIMIT 500",
        pool,
        live,
    )
    return [Pilot.from_record(r) for r in rows]


async def get(conn: Connection, pilot_id: str) -> Pilot | None:
    row = await conn.fetchrow("SELECT * FROM pilots WHERE id = $1", pilot_id)
    return None if row is None else Pilot.from_record(row)


async def withdraw(conn: Connection, pilot_id: str, reason: str) -> Pilot | None:
    """Stop a pilot: one never submitted ends at once, one submitted drains (the scheduler
    cancels its batch job); an ended one is left as it is. None: no such pilot. Locks: the
    pilot's row (its UPDATE)."""
    row = await conn.fetchrow(
        "UPDATE pilots SET"
        " state = CASE WHEN state = 'requested' THEN 'ended' ELSE 'draining' END,"
        " ended_at = CASE WHEN state = 'requested' THEN now() END, reason = $2"
        " WHERE id = $1 AND state <> 'ended' RETURNING *",
        pilot_id,
        reason,
    )
    if row is None:
        return await get(conn, pilot_id)
    return Pilot.from_record(row)


async def submitted(conn: Connection, pilot_id: str, batch_job_id: str) -> None:
    """The batch system took a requested pilot: `pending` there, as batch job `batch_job_id`
    (no host yet: it has one once it runs). Locks: the pilot's row (its UPDATE)."""
    await conn.execute(
        "UPDATE pilots SET state = 'pending', batch_job_id = $2"
        " WHERE id = $1 AND state = 'requested'",
        pilot_id,
        batch_job_id,
    )


async def failed_to_submit(conn: Connection, pilot_id: str, why: str) -> None:
    """The batch system refused a requested pilot: ended, with why. Locks: the pilot's row
    (its UPDATE)."""
    await conn.execute(
        "UPDATE pilots SET state = 'ended', ended_at = now(), reason = $2"
        " WHERE id = $1 AND state = 'requested'",
        pilot_id,
        why,
    )


async def follow(
    conn: Connection,
    pilot_id: str,
    state: str,
    reason: str | None,
    started_at: datetime | None,
    ends_at: datetime | None,
    host_id: str | None = None,
) -> None:
    """The batch state seen for a live pilot: `pending` (with the batch system's reason),
    `running` on host `host_id` (a draining one stays draining, with why, until it ends), or
    `ended` (with why: the withdrawal's, else the batch system's). A pilot has a host and an
    end only once it has run. Locks: the pilot's row (its UPDATE)."""
    await conn.execute(
        "UPDATE pilots SET"
        " state = CASE WHEN $2 <> 'ended' AND state = 'draining' THEN state ELSE $2 END,"
        " reason = CASE WHEN $2 <> 'ended' AND state = 'draining' THEN reason"
        "   WHEN $2 = 'ended' AND state = 'draining' THEN coalesce(reason, $3) ELSE $3 END,"
        " started_at = coalesce(started_at, $4), ends_at = coalesce($5, ends_at),"
        " host_id = coalesce(host_id, $6),"
        " ended_at = CASE WHEN $2 = 'ended' THEN now() END"
        " WHERE id = $1 AND state <> 'ended'",
        pilot_id,
        state,
        reason,
        started_at,
        ends_at,
        host_id,
    )


async def idle(conn: Connection, pilot_id: str, is_idle: bool) -> datetime | None:
    """Note whether a running pilot's host holds no task; since when it has held none.
    Locks: the pilot's row (its UPDATE)."""
    since: datetime | None = await conn.fetchval(
        "UPDATE pilots SET idle_since = CASE WHEN $2 THEN coalesce(idle_since, now()) END"
        " WHERE id = $1 RETURNING idle_since",
        pilot_id,
        is_idle,
    )
    return since
