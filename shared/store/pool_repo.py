"""What the pool's hosts hold and have free (issue 39): read by the leading scheduler's
planning round (`services/scheduler/planning.py`) and by `GET /hosts`.

A task **holds** its job's request (`jobs.req_*`) and its GPU devices (`tasks.gpu_ids`) on its
host from the moment the scheduler claims it for that host until its command has exited:
claimed and not yet set up (`new` with a claim), setting up, waiting for its turn
(`queued`, resting there after a recovery too: it will run on that host), running
(`on_cpu`), or in a cluster stage's recover or restart hook (which leads back to the
command). What comes after the command (`data_ready`, post-processing) holds nothing. A
host's free capacity is its capacity less what its tasks hold; it is never negative here
(a host restarted smaller still shows 0 free, not a debt).

Locks: none (reads).
"""

from dataclasses import dataclass
from typing import Final

from shared.domain.scheduling.resources import Resources
from shared.domain.states import TaskState
from shared.store import sql_states
from shared.store.db import Connection

#: The states in which a task holds its request on its host (`new` only with a claim).
HOLDING_STATES: Final = frozenset(
    {
        TaskState.NEW,
        TaskState.SETTING_UP,
        TaskState.QUEUED,
        TaskState.ON_CPU,
        TaskState.RECOVER_CLUSTER,
        TaskState.RECOVERING_CLUSTER,
        TaskState.RESTART_CLUSTER,
        TaskState.RESTARTING_CLUSTER,
    }
)

#: A task row `t` holding resources on `t.host` (served by `tasks_in_flight`: claimed, or in
#: flight).
HOLDING_SQL: Final = (
    f"(t.claim IS NOT NULL OR t.state NOT IN {sql_states.NOT_IN_FLIGHT})"
    f" AND t.host IS NOT NULL AND t.state IN {sql_states.literal(HOLDING_STATES)}"
    " AND (t.state <> 'new' OR t.claim IS NOT NULL)"
)

#: Per host: what its tasks hold, their GPU devices, and how many tasks there are.
_HELD: Final = f"""
SELECT t.host,
       count(*) AS tasks,
       sum(j.req_millicpus)::bigint AS millicpus,
       sum(j.req_memory_mb)::bigint AS memory_mb,
       coalesce(array_agg(g.id) FILTER (WHERE g.id IS NOT NULL), '{{}}') AS gpu_ids
FROM tasks t JOIN jobs j ON j.id = t.job_id
LEFT JOIN LATERAL unnest(t.gpu_ids) AS g(id) ON true
WHERE {HOLDING_SQL}
GROUP BY t.host
"""


@dataclass(frozen=True)
class HostLoad:
    """One host's capacity, what its tasks hold, and what is left."""

    host_id: str
    capacity: Resources
    gpu_ids: tuple[str, ...]
    held: Resources
    held_gpu_ids: frozenset[str]
    tasks: int

    @property
    def free(self) -> Resources:
        return (self.capacity - self.held).at_least_zero()

    @property
    def free_gpu_ids(self) -> tuple[str, ...]:
        """The host's devices no task holds, in the host's order."""
        return tuple(g for g in self.gpu_ids if g not in self.held_gpu_ids)


async def loads(conn: Connection, host_ids: list[str]) -> dict[str, HostLoad]:
    """Each named host's capacity and what its tasks hold (hosts not in `hosts` left out)."""
    held = {row["host"]: row for row in await conn.fetch(_HELD)}
    rows = await conn.fetch(
        "SELECT id, capacity_millicpus, capacity_memory_mb, gpu_ids FROM hosts"
        " WHERE id = ANY($1::text[])",
        host_ids,
    )
    result: dict[str, HostLoad] = {}
    for row in rows:
        h = held.get(row["id"])
        held_ids = frozenset(h["gpu_ids"]) if h is not None else frozenset()
        result[row["id"]] = HostLoad(
            host_id=row["id"],
            capacity=Resources(
                row["capacity_millicpus"], row["capacity_memory_mb"], len(row["gpu_ids"])
            ),
            gpu_ids=tuple(row["gpu_ids"]),
            held=Resources(
                int(h["millicpus"]) if h else 0,
                int(h["memory_mb"]) if h else 0,
                len(held_ids & frozenset(row["gpu_ids"])),
            ),
            held_gpu_ids=held_ids,
            tasks=int(h["tasks"]) if h else 0,
        )
    return result
