"""Operators' control of host quarantine (the triage's quarantine is a breaker that probes,
see `services/scheduler/breaker.py`): a quarantined host's worker takes no new tasks.

An operator's quarantine is a wall, not a breaker: it lasts until it runs out or is released.
Releasing a host ends a breaker's quarantine too. Each change goes out as
`host.<quarantined|released>.<host>`, with the change, in one transaction."""

from shared.domain.errors import Conflict, NotFound
from shared.domain.messages import HostEvent, HostState
from shared.store import hosts_repo, outbox
from shared.store.db import Connection

#: An operator's quarantine lasts this long unless released earlier.
DEFAULT_QUARANTINE_S = 7 * 24 * 3600.0


async def release(conn: Connection, host_id: str, actor: str) -> None:
    """End the host's quarantine; `Conflict` if it is not quarantined."""
    async with conn.transaction():
        if not await hosts_repo.release(conn, host_id):
            await _must_exist(conn, host_id)
            raise Conflict(
                f"host {host_id} is not quarantined",
                next_step="nothing to release: it takes work (`vigil hosts` shows every host)",
            )
        await outbox.add_host_event(
            conn,
            HostEvent(
                host=host_id, state=HostState.RELEASED, reason=f"released by {actor}", by=actor
            ),
        )


async def quarantine(
    conn: Connection, host_id: str, actor: str, reason: str, duration_s: float
) -> None:
    """Quarantine the host for `duration_s` (or until released)."""
    async with conn.transaction():
        until = await hosts_repo.quarantine(
            conn, host_id, duration_s, f"quarantined by {actor}: {reason}"
        )
        if until is None:
            raise NotFound(f"host {host_id!r} not found")
        await outbox.add_host_event(
            conn,
            HostEvent(
                host=host_id,
                state=HostState.QUARANTINED,
                reason=f"quarantined by {actor}: {reason}",
                until=until,
                by=actor,
            ),
        )


async def _must_exist(conn: Connection, host_id: str) -> None:
    if not await conn.fetchval("SELECT 1 FROM hosts WHERE id = $1", host_id):
        raise NotFound(f"host {host_id!r} not found")
