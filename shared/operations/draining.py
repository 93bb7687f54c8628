"""Operators drain a host (`POST /hosts/{id}/actions`, `vigil hosts drain HOST`): it finishes
the tasks it holds and takes no new one from its pool until undrained. Its worker learns it with
its next heartbeat (`services/worker/admission.py`)."""

from shared.domain.errors import Conflict, NotFound
from shared.store import hosts_repo
from shared.store.db import Connection


async def drain(conn: Connection, host_id: str) -> None:
    """Drain the host (a no-op if it already drains)."""
    if await hosts_repo.drain(conn, host_id):
        return
    raise NotFound(f"host {host_id!r} not found")


async def undrain(conn: Connection, host_id: str) -> None:
    """Let a draining host take new tasks again; `Conflict` if it is not draining."""
    if await hosts_repo.undrain(conn, host_id):
        return
    if not await conn.fetchval("SELECT 1 FROM hosts WHERE id = $1", host_id):
        raise NotFound(f"host {host_id!r} not found")
    raise Conflict(
        f"host {host_id} is not draining",
        next_step="nothing to undrain: it takes work (`vigil hosts` shows every host)",
    )
