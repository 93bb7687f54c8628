"""Read queries the api needs that the shared repositories do not have (parameterised SQL only)."""

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from shared.domain.scheduling.resources import Resources
from shared.domain.states import FAILED, IN_FLIGHT
from shared.store import emergency_repo, hosts_repo
from shared.store.db import SCHEDULER_LOCK_KEY, Connection
from shared.store.tasks_repo import Task


async def ping(conn: Connection) -> bool:
    """True when the database answers a trivial query."""
    return bool(await conn.fetchval("SELECT 1") == 1)


async def counts_for_jobs(
    conn: Connection, job_ids: list[str]
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Tasks per state of each job in `job_ids` (jobs without tasks are left out), and how
    many of its tasks were superseded by their resubmitted clone (jobs with none left out):
    test tasks left out, and superseded ones left out of the states, as in `jobs_repo.counts`."""
    rows = await conn.fetch(
        "SELECT job_id, state::text AS state, superseded_by IS NOT NULL AS superseded,"
        " count(*) AS n FROM tasks WHERE job_id = ANY($1::text[]) AND NOT test GROUP BY 1, 2, 3",
        job_ids,
    )
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    superseded: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["superseded"]:
            superseded[row["job_id"]] += int(row["n"])
        else:
            counts[row["job_id"]][row["state"]] = int(row["n"])
    return dict(counts), dict(superseded)


#: The triage's decision on a task's failure: (verdict, reason).
Decision = tuple[str, str | None]


async def decisions_of(conn: Connection, tasks: Sequence[Task]) -> dict[str, Decision]:
    """The triage's decision on the last attempt of each failed task among `tasks` (one
    index probe each, `attempts`' `(task_id, attempt)` key); a failure not yet decided has
    none, and tasks not failed are not looked at."""
    failed = [t.id for t in tasks if t.state in FAILED]
    if not failed:
        return {}
    rows = await conn.fetch(
        "SELECT u.id, a.decision, a.decision_reason FROM unnest($1::text[]) AS u(id)"
        " CROSS JOIN LATERAL (SELECT decision, decision_reason FROM attempts"
        "   WHERE task_id = u.id ORDER BY attempt DESC LIMIT 1) a"
        " WHERE a.decision IS NOT NULL",
        failed,
    )
    return {r["id"]: (r["decision"], r["decision_reason"]) for r in rows}


@dataclass(frozen=True)
class Timing:
    """When a task ran, from its attempts, as of the read (`timings_of`)."""

    started_at: datetime  # its first attempt's start
    stage_started_at: datetime | None  # in flight, while an attempt runs: that attempt's start
    ended_at: datetime | None  # at rest: its last attempt's end
    elapsed_s: float | None  # see `timings_of`

    def fields(self) -> dict[str, Any]:
        """As the view's fields of the same names."""
        return dataclasses.asdict(self)


_TIMINGS: Final = """
SELECT u.id, a.first_start, a.open_start, a.last_end,
       extract(epoch FROM CASE WHEN u.resting THEN a.last_end - a.first_start
                               ELSE now() - coalesce(a.open_start, a.first_start) END)::float8
           AS elapsed
FROM unnest($1::text[], $2::boolean[]) AS u(id, resting)
JOIN (SELECT task_id, min(started_at) AS first_start,
             max(started_at) FILTER (WHERE ended_at IS NULL) AS open_start,
             max(ended_at) AS last_end
      FROM attempts WHERE task_id = ANY($1::text[]) GROUP BY task_id) a ON a.task_id = u.id
"""


async def timings_of(conn: Connection, tasks: Sequence[Task]) -> dict[str, Timing]:
    """When each of `tasks` that ever started ran (one probe of `attempts`' `(task_id,
    attempt)` key each). `elapsed_s`, by the database's clock: in flight, the time in the
    stage that runs (or, between stages, as `queued` for a slot, since the first start); at
    rest (ended, failed, `new` or `on_hold` again), from its first start to its last
    attempt's end."""
    if not tasks:
        return {}
    resting = {t.id: t.state not in IN_FLIGHT for t in tasks}
    rows = await conn.fetch(_TIMINGS, list(resting), list(resting.values()))
    return {
        r["id"]: Timing(
            started_at=r["first_start"],
            stage_started_at=None if resting[r["id"]] else r["open_start"],
            ended_at=r["last_end"] if resting[r["id"]] else None,
            elapsed_s=None if r["elapsed"] is None else max(r["elapsed"], 0.0),
        )
        for r in rows
    }


async def visible_tasks(conn: Connection, task_ids: list[str], owner_id: str | None) -> set[str]:
    """The ids among `task_ids` that exist and belong to `owner_id`'s jobs (None: anyone's)."""
    rows = await conn.fetch(
        "SELECT t.id FROM tasks t JOIN jobs j ON j.id = t.job_id"
        " WHERE t.id = ANY($1::text[]) AND ($2::text IS NULL OR j.owner_id = $2)",
        task_ids,
        owner_id,
    )
    return {row["id"] for row in rows}


async def job_visible(conn: Connection, job_id: str, owner_id: str | None) -> bool:
    """True when job `job_id` exists and belongs to `owner_id` (None: anyone)."""
    found = await conn.fetchval(
        "SELECT 1 FROM jobs WHERE id = $1 AND ($2::text IS NULL OR owner_id = $2)",
        job_id,
        owner_id,
    )
    return found is not None


async def prerequisites_of(
    conn: Connection, task_ids: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """The prerequisite rows of each task, as `{stage, task_id, required}` (ordered)."""
    rows = await conn.fetch(
        "SELECT task_id, stage, on_task_id, required FROM task_prerequisites"
        " WHERE task_id = ANY($1::text[]) ORDER BY task_id, stage, on_task_id",
        task_ids,
    )
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        found[row["task_id"]].append(
            {"stage": row["stage"], "task_id": row["on_task_id"], "required": row["required"]}
        )
    return dict(found)


async def tasks_per_state(conn: Connection) -> dict[str, int]:
    """Number of tasks in each state, over every job (for the metrics scrape)."""
    rows = await conn.fetch("SELECT state::text AS state, count(*) AS n FROM tasks GROUP BY state")
    return {row["state"]: int(row["n"]) for row in rows}


async def jobs_per_state(conn: Connection) -> dict[str, int]:
    """Number of jobs in each state (for the metrics scrape)."""
    rows = await conn.fetch("SELECT state::text AS state, count(*) AS n FROM jobs GROUP BY state")
    return {row["state"]: int(row["n"]) for row in rows}


async def failed_attempts_per_class(conn: Connection) -> dict[str, int]:
    """Number of attempts that ended with each failure class, over all history."""
    rows = await conn.fetch(
        "SELECT failure_class::text AS class, count(*) AS n FROM attempts"
        " WHERE failure_class IS NOT NULL GROUP BY failure_class"
    )
    return {row["class"]: int(row["n"]) for row in rows}


@dataclass(frozen=True)
class Latencies:
    """Detection latencies as a histogram: cumulative counts per upper bound, count and sum."""

    buckets: list[tuple[float, int]]
    count: int
    total: float


async def detection_latencies(conn: Connection, bounds: Sequence[float]) -> dict[str, Latencies]:
    """The detection latency (`attempts.detected_after_s`) of every failed attempt that has
    one, as a histogram per failure class. One grouped query; `bounds` are constants."""
    counts = ", ".join(
        f"count(*) FILTER (WHERE detected_after_s <= {float(b)!r}) AS b{i}"
        for i, b in enumerate(bounds)
    )
    rows = await conn.fetch(
        f"SELECT failure_class::text AS class, count(*) AS n,"
        f" coalesce(sum(detected_after_s), 0) AS total, {counts}"
        " FROM attempts WHERE detected_after_s IS NOT NULL GROUP BY failure_class"
    )
    return {
        row["class"]: Latencies(
            [(b, int(row[f"b{i}"])) for i, b in enumerate(bounds)],
            int(row["n"]),
            float(row["total"]),
        )
        for row in rows
    }


async def outbox_pending(conn: Connection) -> dict[str, int]:
    """Outbox rows not yet relayed to the broker, per exchange (`events`, `work`)."""
    rows = await conn.fetch("SELECT exchange, count(*) AS n FROM outbox GROUP BY exchange")
    return {row["exchange"]: int(row["n"]) for row in rows}


async def host_heartbeat_ages(conn: Connection, limit: int) -> dict[str, float]:
    """Seconds since each host of the fleet (`hosts_repo.in_fleet`) last heartbeat as
    PostgreSQL recorded it (at most `limit`)."""
    rows = await conn.fetch(
        "SELECT id, extract(epoch FROM now() - heartbeat_at)::float8 AS age FROM hosts"
        f" WHERE {hosts_repo.in_fleet('hosts')} ORDER BY id LIMIT $1",
        limit,
    )
    return {row["id"]: max(float(row["age"]), 0.0) for row in rows}


_LEADING: Final = """
SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
    WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()
      AND l.classid = 0 AND l.objid = $1::bigint::oid AND l.objsubid = 1)
"""


async def scheduler_leading(conn: Connection) -> bool:
    """Whether a scheduler holds the leader's advisory lock on this database."""
    return bool(await conn.fetchval(_LEADING, SCHEDULER_LOCK_KEY))


async def outbox_oldest_age(conn: Connection) -> float | None:
    """Seconds the oldest unpublished outbox row has waited (None: nothing waits)."""
    age = await conn.fetchval(
        "SELECT extract(epoch FROM now() - o.created_at)::float8"
        " FROM outbox o ORDER BY o.id LIMIT 1"
    )
    return None if age is None else max(float(age), 0.0)


async def dead_letters(conn: Connection) -> int:
    """Work messages the broker gave up on, as the schedulers recorded them (all history)."""
    return int(
        await conn.fetchval("SELECT count(*) FROM job_errors WHERE severity = 'dead_letter'")
    )


async def host_quarantines(conn: Connection, limit: int) -> dict[str, tuple[bool, bool]]:
    """Each host of the fleet's (quarantined, probing) flags (at most `limit` hosts)."""
    rows = await conn.fetch(
        "SELECT id, quarantined, probing_since IS NOT NULL AS probing FROM hosts"
        f" WHERE {hosts_repo.in_fleet('hosts')} ORDER BY id LIMIT $1",
        limit,
    )
    return {row["id"]: (row["quarantined"], row["probing"]) for row in rows}


async def emergency_stop_in_force(conn: Connection) -> bool:
    """True while an emergency stop is in force."""
    return await emergency_repo.in_force_id(conn) is not None


async def live_capacities(conn: Connection, pool: str, fresh_s: float) -> dict[str, Resources]:
    """The capacity of each host of `pool` whose worker heartbeated within `fresh_s` seconds
    and advertised one (0 CPUs until its worker did)."""
    rows = await conn.fetch(
        "SELECT id, capacity_millicpus, capacity_memory_mb, cardinality(gpu_ids) AS gpus"
        " FROM hosts WHERE pool = $1 AND worker IS NOT NULL AND capacity_millicpus > 0"
        " AND heartbeat_at > now() - make_interval(secs => $2)",
        pool,
        fresh_s,
    )
    return {
        r["id"]: Resources(r["capacity_millicpus"], r["capacity_memory_mb"], int(r["gpus"]))
        for r in rows
    }
