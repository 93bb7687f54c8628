"""Operators' control of host quarantine (the triage quarantines hosts by itself, see
`services/scheduler/triage.py`): a quarantined host's worker takes no new tasks."""

from shared.db import Connection
from shared.errors import Conflict, NotFound

#: An operator's quarantine lasts this long unless released earlier.
DEFAULT_QUARANTINE_S = 7 * 24 * 3600.0


async def release(conn: Connection, host_id: str, actor: str) -> None:
    """End the host's quarantine; `Conflict` if it is not quarantined."""
    status = await conn.execute(
        "UPDATE hosts SET quarantined = false, quarantined_until = now(),"
        " quarantine_reason = NULL WHERE id = $1 AND quarantined",
        host_id,
    )
    if status == "UPDATE 0":
        await _must_exist(conn, host_id)
        raise Conflict(
            f"host {host_id} is not quarantined",
            next_step="nothing to release: it takes work (`vigil hosts` shows every host)",
        )


async def quarantine(
    conn: Connection, host_id: str, actor: str, reason: str, duration_s: float
) -> None:
    """Quarantine the host for `duration_s` (or until released)."""
    status = await conn.execute(
        "UPDATE hosts SET quarantined = true,"
        " quarantined_until = now() + make_interval(secs => $2), quarantine_reason = $3"
        " WHERE id = $1",
        host_id,
        duration_s,
        f"quarantined by {actor}: {reason}",
    )
    if status == "UPDATE 0":
        raise NotFound(f"host {host_id!r} not found")


async def _must_exist(conn: Connection, host_id: str) -> None:
    if not await conn.fetchval("SELECT 1 FROM hosts WHERE id = $1", host_id):
        raise NotFound(f"host {host_id!r} not found")
