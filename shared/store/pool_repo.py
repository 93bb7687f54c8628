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
from typing import Any, Final

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

#: Per host: what its tasks hold, their GPU devices, how many tasks there are, how many of
#: them have not started their command yet (`pending`), and the CPUs of those that have.
#: One row a task: a task's devices are joined into one list per host as text (a device id
#: never holds a comma: `capacity.parse_gpu_ids`), not unnested, which made a row per device
#: and counted a task of two GPUs twice (its tasks, CPUs and memory).
HELD_BY_HOST: Final = f"""
SELECT t.host,
       count(*) AS tasks,
       count(*) FILTER (WHERE t.state <> 'on_cpu') AS pending,
       sum(j.req_millicpus)::bigint AS millicpus,
       sum(j.req_memory_mb)::bigint AS memory_mb,
       coalesce(sum(j.req_millicpus) FILTER (WHERE t.state = 'on_cpu'), 0)::bigint AS running,
       string_to_array(string_agg(array_to_string(t.gpu_ids, ','), ',')
                       FILTER (WHERE cardinality(t.gpu_ids) > 0), ',') AS gpu_ids
FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE {HOLDING_SQL}
GROUP BY t.host
"""

#: A host `h` and what its tasks hold `l` (`HELD_BY_HOST`, left-joined), as `load_of` reads it.
LOAD_COLUMNS: Final = """h.id, h.capacity_millicpus, h.capacity_memory_mb, h.gpu_ids,
       coalesce(l.tasks, 0) AS tasks, coalesce(l.pending, 0) AS pending,
       coalesce(l.millicpus, 0) AS millicpus, coalesce(l.memory_mb, 0) AS memory_mb,
       coalesce(l.running, 0) AS running, coalesce(l.gpu_ids, '{}') AS held_gpu_ids"""


@dataclass(frozen=True)
class HostLoad:
    """One host's capacity, what its tasks hold, and what is left."""

    host_id: str
    capacity: Resources
    gpu_ids: tuple[str, ...]
    held: Resources
    held_gpu_ids: frozenset[str]
    tasks: int
    #: Of its tasks, those that have not started their command yet, and the CPUs of those
    #: that have (to tell the tasks handed to it beyond its capacity: the prefetch).
    pending: int = 0
    running_millicpus: int = 0

    @property
    def free(self) -> Resources:
        return (self.capacity - self.held).at_least_zero()

    @property
    def free_gpu_ids(self) -> tuple[str, ...]:
        """The host's devices no task holds, in the host's order."""
        return tuple(g for g in self.gpu_ids if g not in self.held_gpu_ids)


def load_of(row: Any) -> HostLoad:
    """A row of `LOAD_COLUMNS`."""
    gpu_ids = tuple(row["gpu_ids"])
    held_ids = frozenset(row["held_gpu_ids"])
    return HostLoad(
        host_id=row["id"],
        capacity=Resources(row["capacity_millicpus"], row["capacity_memory_mb"], len(gpu_ids)),
        gpu_ids=gpu_ids,
        held=Resources(
            int(row["millicpus"]), int(row["memory_mb"]), len(held_ids & frozenset(gpu_ids))
        ),
        held_gpu_ids=held_ids,
        tasks=int(row["tasks"]),
        pending=int(row["pending"]),
        running_millicpus=int(row["running"]),
    )


async def loads(conn: Connection, host_ids: list[str]) -> dict[str, HostLoad]:
    """Each named host's capacity and what its tasks hold (hosts not in `hosts` left out)."""
    rows = await conn.fetch(
        f"SELECT {LOAD_COLUMNS} FROM hosts h LEFT JOIN ({HELD_BY_HOST}) l ON l.host = h.id"
        " WHERE h.id = ANY($1::text[])",
        host_ids,
    )
    return {row["id"]: load_of(row) for row in rows}
