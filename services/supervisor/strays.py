"""Stray processes: commands still running on this host that no task accounts for any more.

Every command carries `VIGIL_MARK=<namespace>/<host>/<task id>/<claim>` in its environment,
inherited by everything it starts, including processes that left its process group. A marked
process is legitimate only while its task is `new` (a setup whose take is folded into the
`on_cpu` move: `StageRunner.take`), `setting_up` or `queued` (being started: the worker spawns
it held at its gate, then records `on_cpu`, through `queued` in the same move when a slot is
free) or `on_cpu`, under the same claim; anything else (the task was declared lost,
timed out, cancelled, or finished and left a daemon behind) is killed. This is how a restarted
supervisor finds what a dead one left.
"""

import contextlib
import logging
import os
import signal
from uuid import UUID

from shared.host.cgroups import Cgroups
from shared.host.marks import Marked, marked_processes
from shared.store.db import Pool

logger = logging.getLogger(__name__)

_LEGIT_STATES = ("new", "setting_up", "queued", "on_cpu")


async def legitimate(pool: Pool, task_ids: set[str]) -> set[tuple[str, UUID]]:
    """The (task, claim) of those of `task_ids` whose task may have a command running."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT id, claim, state::text AS state FROM tasks WHERE id = ANY($1)",
            sorted(task_ids),
        )
    return {(r["id"], r["claim"]) for r in rows if r["state"] in _LEGIT_STATES}


async def kill_strays(
    pool: Pool, namespace: str, host_id: str, cgroups: Cgroups | None
) -> list[Marked]:
    """Kill marked processes whose task no longer runs them; returns what was killed."""
    marked = [m for m in marked_processes(namespace, host_id) if m.pid != os.getpid()]
    if not marked:
        return []
    legit = await legitimate(pool, {m.task_id for m in marked})
    strays = [m for m in marked if (m.task_id, m.claim) not in legit]
    for stray in strays:
        if cgroups is not None:
            cgroups.kill(stray.task_id, stray.claim)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(stray.pid, signal.SIGKILL)
        logger.warning(
            "killed stray process %d of task %s",
            stray.pid,
            stray.task_id,
            extra={"task_id": stray.task_id},
        )
    return strays
