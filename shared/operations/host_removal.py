"""Operators remove a host (`DELETE /hosts/{id}`, `vigil hosts rm HOST`): it leaves the fleet.

A host alive (its worker registered, it or its supervisor beating) that holds tasks is
refused unless forced: drain it first and remove it once it holds none. Removing resolves the
tasks its workers hold as a dead host's are (`loss.declare_all`, the reaper's path: lost, then
the triage's rules), marks it removed with `host.removed.<host>` in one transaction, and leaves
its queues to the leading scheduler, which deletes them once nothing in them is owed
(`services/scheduler/host_queues.py`). Its running worker stops at its next beat; a worker
that registers under its id later brings it back as a new host.
"""

from dataclasses import dataclass

from shared.domain.errors import Conflict, NotFound
from shared.domain.messages import HostEvent, HostState
from shared.operations import loss
from shared.store import hosts_repo, outbox, tasks_repo
from shared.store.db import Connection


@dataclass(frozen=True)
class Removal:
    """A host removed, and how many of its tasks were declared lost with it."""

    host: str
    tasks_lost: int


async def remove(
    conn: Connection, host_id: str, actor: str, *, force: bool, dead_after_s: float
) -> Removal:
    """Remove the host (see the module); `NotFound` if there is none (or it is removed
    already), `Conflict` if it is alive and holds tasks and `force` is not given."""
    async with conn.transaction():
        standing = await hosts_repo.lock_standing(conn, host_id, dead_after_s)
        if standing is None or standing.removed:
            raise NotFound(f"host {host_id!r} not found (a removed host is not listed)")
        held = await tasks_repo.held_on(conn, host_id)
        if held and standing.alive and not force:
            raise Conflict(
                f"host {host_id} is alive and holds {len(held)} task(s)",
                next_step=f"drain it (`vigil hosts drain {host_id}`) and remove it once it"
                " holds none, or remove it with --force (its tasks are then lost: a"
                " restartable job's run again elsewhere)",
            )
        why = f"host {host_id} removed by {actor}"
        lost = await loss.declare_all(conn, held, why)
        await hosts_repo.remove(conn, host_id, actor)
        await outbox.add_host_event(
            conn, HostEvent(host=host_id, state=HostState.REMOVED, reason=why, by=actor)
        )
    return Removal(host_id, lost)
