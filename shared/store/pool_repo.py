"""What the pool's hosts hold and have free: read by the leading scheduler's
planning round (`services/scheduler/planning.py`) and by `GET /hosts`.

A task **holds** its job's request (`jobs.req_*`, copied to the task by the claim: `hold_*`)
and its GPU devices (`tasks.gpu_ids`) on its host from the moment the scheduler claims it for
that host until its command has exited:
claimed and not yet set up (`new` with a claim), setting up, waiting for its turn
(`queued`, resting there after a recovery too: it will run on that host), running
(`on_cpu`), or in a cluster stage's recover or restart hook (which leads back to the
command). What comes after the command (`data_ready`, post-processing) holds nothing. A
host's free capacity is its capacity less what its tasks hold; it is never negative here
(a host restarted smaller still shows 0 free, not a debt).

Locks: none (reads).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
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

#: A task row `t` in flight: claimed, or in a state in flight (the predicate of
#: `tasks_in_flight`).
IN_FLIGHT_SQL: Final = f"(t.claim IS NOT NULL OR t.state NOT IN {sql_states.NOT_IN_FLIGHT})"

#: A task row `t` in flight (`IN_FLIGHT_SQL`) that holds resources on `t.host`.
_HOLDS_IN_FLIGHT: Final = (
    f"t.host IS NOT NULL AND t.state IN {sql_states.literal(HOLDING_STATES)}"
    " AND (t.state <> 'new' OR t.claim IS NOT NULL)"
)

#: Per host, and per owner, the tasks in flight (`in_flight`), and of them those holding
#: resources (`tasks`; of those, `pending`: not started their command yet), their jobs'
#: requests, the CPUs of those running, and their devices: the one read of what the tasks
#: in flight hold, for the planning round's hosts and users at once and for `loads`
#: (`fold_held`; `by_host` tells a host's row from an owner's). A task's devices are joined
#: into one list as text (a device id never holds a comma: `capacity.parse_gpu_ids`), not
#: unnested, which made a row per device and counted a task of two GPUs twice. What a task
#: holds and for whom is its own (`hold_*`, set by the round's claim, migration 0043): the
#: tasks are read alone, no job looked up (a lookup a task was 40-85 ms a look with 16,000 in
#: flight on 1,000 hosts). A task in flight without them (claimed before that migration, or
#: put in flight otherwise) has its job looked up by its id (`tasks_in_flight_unheld`;
#: `OFFSET 0` keeps the lookup a subquery per row: a join was planned as a hash of every
#: job, history included). Grouped by host and owner together, a thousand hosts running the
#: tasks of 50 users made 15,000 rows: the two groupings are two grouping sets.
HELD_BY_HOST_AND_OWNER: Final = f"""
SELECT GROUPING(t.host) = 0 AS by_host, t.host, t.owner_id, count(*) AS in_flight,
       count(*) FILTER (WHERE t.holds) AS tasks,
       count(*) FILTER (WHERE t.holds AND t.state <> 'on_cpu') AS pending,
       coalesce(sum(t.millicpus) FILTER (WHERE t.holds), 0)::bigint AS millicpus,
       coalesce(sum(t.memory_mb) FILTER (WHERE t.holds), 0)::bigint AS memory_mb,
       coalesce(sum(t.gpus) FILTER (WHERE t.holds), 0)::bigint AS gpus,
       coalesce(sum(t.millicpus) FILTER (WHERE t.holds AND t.state = 'on_cpu'), 0)::bigint
           AS running,
       string_to_array(string_agg(array_to_string(t.gpu_ids, ','), ',')
                       FILTER (WHERE t.holds AND cardinality(t.gpu_ids) > 0), ',') AS gpu_ids
FROM (
    SELECT t.host, t.state, t.gpu_ids, {_HOLDS_IN_FLIGHT} AS holds, t.hold_owner AS owner_id,
           t.hold_millicpus AS millicpus, t.hold_memory_mb AS memory_mb, t.hold_gpus AS gpus
    FROM tasks t WHERE {IN_FLIGHT_SQL} AND t.hold_owner IS NOT NULL
    UNION ALL
    SELECT t.host, t.state, t.gpu_ids, t.holds, j.owner_id, j.req_millicpus, j.req_memory_mb,
           j.req_gpus
    FROM (SELECT t.job_id, t.host, t.state, t.gpu_ids, {_HOLDS_IN_FLIGHT} AS holds
          FROM tasks t WHERE {IN_FLIGHT_SQL} AND t.hold_owner IS NULL OFFSET 0) t
    CROSS JOIN LATERAL (
        SELECT j.owner_id, j.req_millicpus, j.req_memory_mb, j.req_gpus
        FROM jobs j WHERE j.id = t.job_id OFFSET 0) j
) t
GROUP BY GROUPING SETS ((t.host), (t.owner_id))
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
    #: Of its tasks, those that have not started their command yet, and the CPUs of those
    #: that have (to tell the tasks handed to it beyond its capacity: the prefetch).
    pending: int = 0
    running_millicpus: int = 0

    @cached_property
    def free(self) -> Resources:
        return (self.capacity - self.held).at_least_zero()

    @property
    def free_gpu_ids(self) -> tuple[str, ...]:
        """The host's devices no task holds, in the host's order."""
        return tuple(g for g in self.gpu_ids if g not in self.held_gpu_ids)


@dataclass(frozen=True)
class Held:
    """What some tasks in flight hold: how many are in flight, how many of them hold
    resources, of those how many have not started their command, their jobs' requests
    summed, the CPUs of those running, and their devices."""

    in_flight: int = 0
    tasks: int = 0
    pending: int = 0
    requested: Resources = field(default_factory=Resources)
    running_millicpus: int = 0
    gpu_ids: frozenset[str] = frozenset()


def fold_held(rows: Iterable[Any]) -> tuple[dict[str, Held], dict[str, Held]]:
    """Rows of `HELD_BY_HOST_AND_OWNER`, per host and per owner (the tasks in flight on no
    host are in their owner's only)."""
    by_host, by_owner = split_held(rows)
    return {host: held_of(row) for host, row in by_host.items()}, by_owner


def split_held(rows: Iterable[Any]) -> tuple[dict[str, Any], dict[str, Held]]:
    """`fold_held`, each host's row left as it was read (`held_of` makes it a `Held`)."""
    by_host: dict[str, Any] = {}
    by_owner: dict[str, Held] = {}
    for row in rows:
        if not row["by_host"]:
            by_owner[row["owner_id"]] = held_of(row)
        elif row["host"] is not None:
            by_host[row["host"]] = row
    return by_host, by_owner


def held_of(row: Any) -> Held:
    """One row of `HELD_BY_HOST_AND_OWNER`."""
    return Held(
        int(row["in_flight"]),
        int(row["tasks"]),
        int(row["pending"]),
        Resources(int(row["millicpus"]), int(row["memory_mb"]), int(row["gpus"])),
        int(row["running"]),
        frozenset(row["gpu_ids"] or ()),
    )


def host_load(
    host_id: str,
    capacity_millicpus: int,
    capacity_memory_mb: int,
    gpu_ids: Sequence[str],
    held: Held,
) -> HostLoad:
    """A host of this capacity and devices whose tasks hold `held`."""
    devices = tuple(gpu_ids)
    return HostLoad(
        host_id=host_id,
        capacity=Resources(capacity_millicpus, capacity_memory_mb, len(devices)),
        gpu_ids=devices,
        held=Resources(
            held.requested.millicpus,
            held.requested.memory_mb,
            len(held.gpu_ids & frozenset(devices)),
        ),
        held_gpu_ids=held.gpu_ids,
        tasks=held.tasks,
        pending=held.pending,
        running_millicpus=held.running_millicpus,
    )


async def loads(conn: Connection, host_ids: list[str]) -> dict[str, HostLoad]:
    """Each named host's capacity and what its tasks hold (hosts not in `hosts` left out)."""
    rows = await conn.fetch(
        "SELECT id, capacity_millicpus, capacity_memory_mb, gpu_ids FROM hosts"
        " WHERE id = ANY($1::text[])",
        host_ids,
    )
    by_host, _ = fold_held(await conn.fetch(HELD_BY_HOST_AND_OWNER))
    return {
        row["id"]: host_load(
            row["id"],
            row["capacity_millicpus"],
            row["capacity_memory_mb"],
            row["gpu_ids"],
            by_host.get(row["id"], Held()),
        )
        for row in rows
    }
