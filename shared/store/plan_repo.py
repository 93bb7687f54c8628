"""The planning round's reads and writes: the feed the planner is given, the claims
its plan makes, the reasons it leaves, and the usage it charges. The leading scheduler runs
them (`services/scheduler/planning.py`), in one transaction per round.

The feed is set-based: one statement per kind (hosts, what they hold, waiting jobs, users),
one row per host, per job with tasks waiting, per user: never one per waiting task, and
nothing over the tasks that have ended (the probes are the dispatcher's, index scans of
`tasks_new` and `tasks_in_flight`).

Locks: `claim` takes the row lock of each task it claims until the transaction ends; the
writes to `job_waits` and `users` take those rows' locks; the reads lock nothing.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from shared.domain.prerequisites import met_arrays, unmet_sql
from shared.domain.scheduling.resources import Resources
from shared.store import loose_scan, sql_states
from shared.store.db import Connection
from shared.store.pool_repo import (
    HELD_BY_HOST_AND_OWNER,
    Held,
    HostLoad,
    held_of,
    host_load,
    split_held,
)

#: Emergency stops: nothing is placed while one is in force.
_NOT_STOPPED: Final = "NOT EXISTS (SELECT 1 FROM emergency_stops WHERE resumed_at IS NULL)"


def _releasable(first: int) -> str:
    """A new task `t` of job `j` that may be placed now but for the pool's policy:
    unclaimed, its backoff passed, its setup prerequisites met (the met arrays from
    `$first`), a test task only of a configuring job."""
    return f"""t.job_id = j.id AND t.state = 'new' AND t.claim IS NULL
  AND (NOT t.test OR j.state = 'configuring')
  AND (t.not_before IS NULL OR t.not_before <= now())
  AND NOT {unmet_sql("setup", first=first)}"""


#: A job's columns as the feed reads them, and its waiting tasks (`w`) and in flight.
_JOB_COLUMNS: Final = f"""j.id, j.owner_id, j.priority, j.req_millicpus, j.req_memory_mb,
       j.req_gpus,
       CASE WHEN j.probing_since IS NULL THEN j.max_in_flight ELSE 1 END AS max_in_flight,
       (j.policy->>'walltime')::float8 AS walltime,
       coalesce((j.policy->>'restartable')::boolean, false) AS restartable,
       w.n AS waiting, extract(epoch FROM w.since)::float8 AS since,
       (SELECT count(*) FROM tasks x WHERE x.job_id = j.id
          AND (x.claim IS NOT NULL OR x.state NOT IN {sql_states.NOT_IN_FLIGHT})) AS in_flight"""

#: Whether a job `j` has an unclaimed new task (`tasks_new`, as the dispatcher does: an index
#: probe per job, never the job's whole history).
_HAS_NEW: Final = """CROSS JOIN LATERAL (
    SELECT 1 FROM tasks n WHERE n.job_id = j.id AND n.claim IS NULL AND n.state = 'new'
    ORDER BY n.index LIMIT 1) has_new"""

#: A job `j`'s probe: its releasable tasks counted up to $1 (more would not change the plan,
#: only the "tasks ahead" of its reasons, which are then lower bounds), with the moment the
#: first began to wait.
_JOB_PROBES: Final = f"""CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(r.since) AS since FROM (
        SELECT greatest(t.created_at, coalesce(t.not_before, t.created_at)) AS since
        FROM tasks t WHERE {_releasable(2)}
        ORDER BY t.index LIMIT $1) r) w"""

#: Jobs with tasks to place: active ones, and configuring ones (their test tasks) while no
#: stop is in force.
_PLACEABLE: Final = f"(j.state = 'active' OR (j.state = 'configuring' AND {_NOT_STOPPED}))"

#: The jobs with an unclaimed new task, by a loose index scan of `tasks_new`: one descent a
#: job with one, none for a job without (where the other way probes every placeable job).
_PENDING: Final = loose_scan.jobs_with("pending", loose_scan.NEW)


#: The columns of a job that the feed reads (`_JOB_COLUMNS`, `_releasable`, the rank).
_RANKED_COLUMNS: Final = """j.id, j.owner_id, j.state, j.priority, j.created_at, j.req_millicpus,
    j.req_memory_mb, j.req_gpus, j.probing_since, j.max_in_flight, j.policy"""


def _placeable(pending_first: bool) -> tuple[str, str, str]:
    """Where the feed finds the placeable jobs with an unclaimed new task: its `WITH` clause,
    its jobs `j` (with a `WHERE` of theirs), and the probe that keeps a job with such a task.
    Either every placeable job, each probed (`_HAS_NEW`, lazily in a quick round's rank
    order), or, `pending_first`, the jobs with such a task (`_PENDING`), the placeable ones
    among them, no probe: the planning round takes whichever its last look found cheaper
    (`services/scheduler/planning.py`, `feed_from_pending`)."""
    if pending_first:
        return (
            f"WITH RECURSIVE {_PENDING}, placeable AS MATERIALIZED (SELECT {_RANKED_COLUMNS}"
            f" FROM jobs j WHERE j.id IN (SELECT job_id FROM pending) AND {_PLACEABLE})",
            "placeable j WHERE true",
            "",
        )
    return "", f"jobs j WHERE {_PLACEABLE}", _HAS_NEW


def _jobs(pending_first: bool) -> str:
    """Every job with tasks to place (a full round)."""
    with_, jobs, has_new = _placeable(pending_first)
    return f"""{with_}
SELECT {_JOB_COLUMNS}
FROM (SELECT j.* FROM {jobs}) j
{has_new}
{_JOB_PROBES}
WHERE w.n > 0
"""


def _rank_order(job: str) -> str:
    """The order of a quick round's jobs (rows `job`): by rank, highest first (priority plus
    $7 points per hour since the job was made: the planner's rank with the job's age for its
    oldest task's), then the oldest, then by id."""
    return (
        f"{job}.priority + $7 * extract(epoch FROM now() - {job}.created_at) / 3600 DESC,"
        f" {job}.created_at, {job}.id"
    )


#: The (owner, priority) classes of the active and configuring jobs, by a loose scan of
#: `jobs_by_rank_class` (migration 0040): one descent a class, none a job.
_CLASSES: Final = """classes(owner_id, priority) AS (
    (SELECT j.owner_id, j.priority FROM jobs j WHERE j.state IN ('active', 'configuring')
     ORDER BY j.owner_id, j.priority LIMIT 1)
    UNION ALL
    SELECT n.owner_id, n.priority FROM classes c CROSS JOIN LATERAL (
        SELECT j.owner_id, j.priority FROM jobs j
        WHERE j.state IN ('active', 'configuring')
          AND (j.owner_id, j.priority) > (c.owner_id, c.priority)
        ORDER BY j.owner_id, j.priority LIMIT 1) n)"""


#: The jobs of a class `c` (`_CLASSES`), oldest first, by a walk of `jobs_by_rank_class`: one
#: descent a job, each a statement of its own with `LIMIT 1`, so that the order is the
#: index's whatever the statistics, and the walk goes only as far as its reader reads. (A
#: class's jobs read and sorted in one statement were planned, from some statistics, as
#: every job of the class read and sorted: 1.3-2.4 ms a look with 1,000 jobs waiting.)
_CLASS_WALK: Final = f"""walk AS (
    (SELECT {_RANKED_COLUMNS} FROM jobs j
     WHERE j.state IN ('active', 'configuring')
       AND j.owner_id = c.owner_id AND j.priority = c.priority
     ORDER BY j.created_at, j.id LIMIT 1)
    UNION ALL
    SELECT n.* FROM walk p CROSS JOIN LATERAL (
        SELECT {_RANKED_COLUMNS} FROM jobs j
        WHERE j.state IN ('active', 'configuring')
          AND j.owner_id = c.owner_id AND j.priority = c.priority
          AND (j.created_at, j.id) > (p.created_at, p.id)
        ORDER BY j.created_at, j.id LIMIT 1) n)"""


def _top_jobs(pending_first: bool) -> str:
    """Each user's best-ranked jobs with tasks to place, at most $6 (a quick round).

    Probing every placeable job, by class: among one user's jobs of one priority the rank
    orders the oldest first (whatever $7), so each (owner, priority) class is read oldest
    first from `jobs_by_rank_class` and probed until $6 have tasks to place; a user's best
    $6 are among those of their classes, which are then ranked (`_rank_order`). The cost is
    a descent per class and the probes, not the user's jobs: with 1,000 one-task jobs
    waiting, a look sorted all 1,000.

    With `pending_first` (few of the placeable jobs wait: `feed_from_pending`), the jobs
    with a new task are read first, and a user's among them are sorted by rank, job rows
    only, then probed in that order until $6 have tasks to place."""
    if not pending_first:
        return f"""WITH RECURSIVE {_CLASSES}
SELECT x.* FROM (
    SELECT y.*, row_number() OVER (PARTITION BY y.owner_id ORDER BY {_rank_order("y")}) AS nth
    FROM classes c CROSS JOIN LATERAL (
        WITH RECURSIVE {_CLASS_WALK}
        SELECT {_JOB_COLUMNS}, j.created_at
        FROM walk j
        {_HAS_NEW}
        {_JOB_PROBES}
        WHERE {_PLACEABLE} AND w.n > 0
        LIMIT $6) y) x
WHERE x.nth <= $6
"""
    with_, jobs, has_new = _placeable(pending_first)
    return f"""{with_}
SELECT x.* FROM (SELECT DISTINCT j.owner_id FROM {jobs}) o
CROSS JOIN LATERAL (
    SELECT {_JOB_COLUMNS}
    FROM (SELECT j.* FROM {jobs} AND j.owner_id = o.owner_id
          ORDER BY {_rank_order("j")}) j
    {has_new}
    {_JOB_PROBES}
    WHERE w.n > 0
    LIMIT $6) x
"""


#: The feed's two ways to the jobs with tasks to place, as a full and a quick round read
#: them (`_jobs`, `_top_jobs`): constants, made once.
_JOBS: Final = {first: _jobs(first) for first in (False, True)}
_TOP_JOBS: Final = {first: _top_jobs(first) for first in (False, True)}

#: The round's clock, whether a stop is in force, with $1 (a full round) how many jobs are
#: placeable (`Feed.placeable_jobs`; index scans of `jobs_active` and `jobs_configuring`),
#: and with $2 whether any placeable job has an unclaimed new task (`_PENDING`, which stops
#: at the first such job: a descent of `tasks_new` a job with new tasks, none for the jobs
#: without; true, unasked, without $2), each job found looked up by its id (a subquery per
#: row: a join was planned as a hash of every active job). A job whose new tasks all wait (a
#: prerequisite, its `max_in_flight`) counts: the round reads on and writes why it waits.
_CLOCK: Final = f"""
WITH RECURSIVE {_PENDING}
SELECT extract(epoch FROM now())::float8 AS now, NOT {_NOT_STOPPED} AS stopped,
       CASE WHEN $1::boolean THEN (SELECT count(*) FROM jobs j WHERE {_PLACEABLE}) END
           AS placeable,
       NOT $2::boolean OR EXISTS (
           SELECT 1 FROM pending p
           WHERE (SELECT {_PLACEABLE} FROM jobs j WHERE j.id = p.job_id)
       ) AS waiting
"""

#: The pool's hosts with a worker: capacity, whether they take work (what their tasks hold
#: is `HELD_BY_HOST_AND_OWNER`'s).
_HOSTS: Final = """
SELECT h.id, h.capacity_millicpus, h.capacity_memory_mb, h.gpu_ids,
       h.heartbeat_at > now() - make_interval(secs => $2) AS live,
       h.draining, h.quarantined, h.probing_since IS NOT NULL AS probing,
       extract(epoch FROM h.ends_at)::float8 AS ends_at
FROM hosts h
WHERE h.pool = $1 AND h.worker IS NOT NULL
"""

#: Users with tasks in flight or waiting: their share, usage and its age (what their tasks
#: in flight hold is `HELD_BY_HOST_AND_OWNER`'s).
_USERS: Final = """
SELECT u.id, u.share, u.usage, extract(epoch FROM now() - u.usage_at)::float8 AS usage_age
FROM users u WHERE u.id = ANY($1::text[])
"""


#: The staged tasks that have not started their command, per host and owner (`tasks_staged`):
#: how many, and what they hold.
_STAGED: Final = """
SELECT t.host, t.hold_owner AS owner_id, count(*) AS n,
       coalesce(sum(t.hold_millicpus), 0)::bigint AS millicpus,
       coalesce(sum(t.hold_memory_mb), 0)::bigint AS memory_mb
FROM tasks t
WHERE t.staged AND t.claim IS NOT NULL AND t.state IN ('new', 'setting_up', 'queued')
  AND t.hold_owner IS NOT NULL
GROUP BY t.host, t.hold_owner
"""


@dataclass(frozen=True)
class Staged:
    """A user's staged tasks on a host, not started yet: how many, and what they hold."""

    owner_id: str
    count: int
    held: Resources


@dataclass(frozen=True)
class HostRow:
    """A host of the pool: what it holds, and whether it takes work."""

    load: HostLoad
    live: bool
    draining: bool
    quarantined: bool
    probing: bool
    ends_at: float | None = None  # a pilot's end (epoch seconds)


@dataclass(frozen=True)
class JobRow:
    job_id: str
    owner_id: str
    priority: int
    request: Resources
    max_in_flight: int | None
    waiting: int
    since: float  # epoch seconds
    in_flight: int
    walltime_s: float | None = None  # `policy.walltime`
    restartable: bool = False  # `policy.restartable`
    #: Without a walltime, while some host ends: the 95th percentile of what its finished
    #: tasks' commands took (`_TOOK`); None: none has finished, or not asked.
    took_p95_s: float | None = None


@dataclass(frozen=True)
class UserRow:
    user_id: str
    share: float
    usage: float
    usage_age_s: float
    in_flight: int
    held: Resources


@dataclass(frozen=True)
class Feed:
    """What a round is given, as the database has it."""

    now: float  # the database's clock, epoch seconds
    stopped: bool
    hosts: Sequence[HostRow]
    jobs: Sequence[JobRow]
    users: Mapping[str, UserRow]
    #: How many jobs are placeable (active, or configuring outside a stop), counted by a full
    #: round only (None in a quick one): what reading jobs without `pending_first` probes.
    placeable_jobs: int | None = None
    #: Host id -> its staged tasks not started yet, per owner (hosts with none: absent).
    staged: Mapping[str, tuple[Staged, ...]] = field(default_factory=dict)


def feed_from_pending(waiting_jobs: int, placeable_jobs: int) -> bool:
    """Whether the feed should find the jobs with tasks to place from the pending tasks
    (`read`'s `pending_first`), a full round having seen `waiting_jobs` with tasks to place
    among `placeable_jobs`: a descent of `tasks_new` costs about twice a job's probe, so
    when fewer than half the placeable jobs wait (a pool running many small jobs at once).
    """
    return 2 * waiting_jobs < placeable_jobs


def counted_per_job(hosts: Sequence[HostRow], prefetch: int, batch: int) -> int:
    """How many of a job's waiting tasks the feed counts: what one round could place of
    small tasks (four per free CPU, plus the prefetch of each host), within `batch`, at
    least one (to know that it waits)."""
    free = sum(h.load.free.millicpus for h in hosts)
    return max(1, min(batch, free // 250 + prefetch * len(hosts)))


async def read(
    conn: Connection,
    pool: str,
    fresh_s: float,
    prefetch: int,
    batch: int,
    top: tuple[int, float] | None = None,
    pending_first: bool = False,
) -> Feed:
    """The feed of one round for `pool` (a heartbeat fresh for `fresh_s` seconds; waiting
    tasks counted per job as `counted_per_job` says): every job with tasks to place, or,
    with `top` (how many a user, and the age's points per hour), each user's best-ranked
    ones only (`_TOP_JOBS`); those jobs found from the pending tasks with `pending_first`
    (`_placeable`), the same jobs either way. Call it in the round's transaction."""
    feed = await read_unless_idle(
        conn, pool, fresh_s, prefetch, batch, top, pending_first, skip_idle=False
    )
    assert feed is not None  # read whole when not allowed to skip
    return feed


async def read_unless_idle(
    conn: Connection,
    pool: str,
    fresh_s: float,
    prefetch: int,
    batch: int,
    top: tuple[int, float] | None = None,
    pending_first: bool = False,
    *,
    skip_idle: bool = True,
    known: "KnownHosts | None" = None,
) -> Feed | None:
    """`read`, but with `skip_idle`, None after its first statement when no placeable job
    has a new task (`_CLOCK`'s `waiting`): an idle pool's round (every 2 s) then reads none
    of its hosts (their load, an aggregate over the tasks in flight) and plans nothing: 42 %
    of an idle leader's CPU with 1,000 hosts. The hosts that read as they did at
    the last round are `known`'s rows of then (`KnownHosts`)."""
    clock = await conn.fetchrow(_CLOCK, top is None, skip_idle)
    assert clock is not None  # one row, always
    if not clock["waiting"]:
        return None
    now, stopped = float(clock["now"]), bool(clock["stopped"])
    by_host, by_owner = split_held(await conn.fetch(HELD_BY_HOST_AND_OWNER))
    hosts = (known or KnownHosts()).rows(await conn.fetch(_HOSTS, pool, fresh_s), by_host)
    per_job = counted_per_job(hosts, prefetch, batch)
    if top is None:
        rows = await conn.fetch(_JOBS[pending_first], per_job, *met_arrays())
    else:
        rows = await conn.fetch(
            _TOP_JOBS[pending_first], per_job, *met_arrays(), top[0] + per_job, top[1]
        )
    jobs = await _with_lengths(conn, hosts, [_job(row) for row in rows])
    owners = sorted({j.owner_id for j in jobs} | by_owner.keys())
    users = {row["id"]: _user(row, by_owner) for row in await conn.fetch(_USERS, owners)}
    placeable = None if clock["placeable"] is None else int(clock["placeable"])
    return Feed(now, stopped, hosts, jobs, users, placeable, await _staged(conn))


#: Per job of $1, the 95th percentile of how long its finished commands took: the cluster
#: attempts that ended without a failure, of its first $2 tasks (an index walk of the job's
#: tasks, bounded, then each task's attempts by their key): one aggregate a job.
_TOOK: Final = """
SELECT t.job_id, percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM a.ended_at - a.started_at)) AS p95
FROM unnest($1::text[]) AS j(id)
CROSS JOIN LATERAL (
    SELECT t.id, t.job_id FROM tasks t WHERE t.job_id = j.id ORDER BY t.index LIMIT $2) t
JOIN attempts a ON a.task_id = t.id
WHERE a.stage = 'cluster' AND a.ended_at IS NOT NULL AND a.failure_class IS NULL
GROUP BY t.job_id
"""

#: How many of a job's tasks `_TOOK` looks at: tasks run in index order, so its first ones
#: are those that have finished.
TOOK_OF_FIRST: Final = 200


async def _with_lengths(
    conn: Connection, hosts: Sequence[HostRow], jobs: list[JobRow]
) -> list[JobRow]:
    """The jobs, those without a walltime with what their finished tasks took, asked only
    while some host ends (a pilot): elsewhere a task's length decides nothing."""
    unsaid = [j.job_id for j in jobs if j.walltime_s is None]
    if not unsaid or all(h.ends_at is None for h in hosts):
        return jobs
    took = {r["job_id"]: float(r["p95"]) for r in await conn.fetch(_TOOK, unsaid, TOOK_OF_FIRST)}
    return [replace(j, took_p95_s=took[j.job_id]) if j.job_id in took else j for j in jobs]


async def _staged(conn: Connection) -> dict[str, tuple[Staged, ...]]:
    """Per host, its staged tasks not started yet, per owner."""
    found: dict[str, list[Staged]] = {}
    for row in await conn.fetch(_STAGED):
        held = Resources(int(row["millicpus"]), int(row["memory_mb"]))
        found.setdefault(row["host"], []).append(Staged(row["owner_id"], int(row["n"]), held))
    return {host: tuple(of) for host, of in found.items()}


@dataclass
class KnownHosts:
    """The pool's hosts as the feed made them at the last round, kept by the planning round
    between rounds: a host whose row and whose tasks' sums read as they did then is that
    round's `HostRow` again, not made anew. With 1,000 hosts, making each anew was about a
    fifth of a busy round; between two
    rounds of a busy pool few hosts change."""

    _last: dict[str, tuple[tuple[object, ...], HostRow]] = field(default_factory=dict)

    def rows(self, hosts: Sequence[Any], held: Mapping[str, Any]) -> list[HostRow]:
        """The `HostRow` of each of `_HOSTS`'s rows, given each host's row of
        `HELD_BY_HOST_AND_OWNER` (none: it holds nothing)."""
        last = self._last
        kept: dict[str, tuple[tuple[object, ...], HostRow]] = {}
        found = []
        for row in hosts:
            host_id = row["id"]
            theirs = held.get(host_id)
            read = (tuple(row.values()), () if theirs is None else tuple(theirs.values()))
            known = last.get(host_id)
            if known is None or known[0] != read:
                known = (read, _host(row, Held() if theirs is None else held_of(theirs)))
            kept[host_id] = known
            found.append(known[1])
        self._last = kept
        return found


def _host(row: Any, held: Held) -> HostRow:
    return HostRow(
        load=host_load(
            row["id"],
            row["capacity_millicpus"],
            row["capacity_memory_mb"],
            row["gpu_ids"],
            held,
        ),
        live=bool(row["live"]),
        draining=bool(row["draining"]),
        quarantined=bool(row["quarantined"]),
        probing=bool(row["probing"]),
        ends_at=row["ends_at"],
    )


def _job(row: Any) -> JobRow:
    return JobRow(
        job_id=row["id"],
        owner_id=row["owner_id"],
        priority=int(row["priority"]),
        request=Resources(row["req_millicpus"], row["req_memory_mb"], row["req_gpus"]),
        max_in_flight=row["max_in_flight"],
        waiting=int(row["waiting"]),
        since=float(row["since"]),
        in_flight=int(row["in_flight"]),
        walltime_s=row["walltime"],
        restartable=bool(row["restartable"]),
    )


def _user(row: Any, held: Mapping[str, Held]) -> UserRow:
    theirs = held.get(row["id"], Held())
    return UserRow(
        user_id=row["id"],
        share=float(row["share"]),
        usage=float(row["usage"]),
        usage_age_s=max(0.0, float(row["usage_age"])),
        in_flight=theirs.in_flight,
        held=theirs.requested,
    )


#: Per user, how long their commands ran lately on the pool's hosts: the cluster attempts
#: started in the last $2 seconds and ended (`attempts_of_host`: a probe per host), their
#: count and median length.
_RECENT_RUNS: Final = """
SELECT j.owner_id, count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM a.ended_at - a.started_at)) AS median_s
FROM hosts h CROSS JOIN LATERAL (
    SELECT a.task_id, a.started_at, a.ended_at FROM attempts a
    WHERE a.host = h.id AND a.started_at > now() - make_interval(secs => $2)
      AND a.stage = 'cluster' AND a.ended_at IS NOT NULL) a
JOIN tasks t ON t.id = a.task_id JOIN jobs j ON j.id = t.job_id
WHERE h.pool = $1
GROUP BY j.owner_id
"""


async def short_users(
    conn: Connection, pool: str, within_s: float, short_s: float, at_least: int
) -> frozenset[str]:
    """The users whose commands on `pool` ran, over the last `within_s` seconds, at least
    `at_least` times and for less than `short_s` seconds (median): their work is short."""
    rows = await conn.fetch(_RECENT_RUNS, pool, within_s)
    return frozenset(
        r["owner_id"] for r in rows if r["n"] >= at_least and float(r["median_s"]) < short_s
    )


# -- the plan's writes ---------------------------------------------------------------------

#: Claim `n` releasable tasks of each assigned job in index order for its host (compare-and-
#: set: still unclaimed and new), with each task's GPU devices (the assignment's list, by the
#: task's place in it), and queue each one's `RunStage` to the host's queue through the
#: outbox (as `release_round` writes a resting task's), the staged ones last: a worker
#: learns of the tasks placed on its capacity before the staged ones that must leave it to
#: them (`services/worker/ledger.py`). A job placed on several hosts has
#: its first tasks read once (`total`), then dealt out to its assignments in turn (`off`).
#: Each job is looked up by its id (`OFFSET 0`: a join was planned, from some statistics, as
#: a hash of every active job, 0.6-0.8 ms a claim with 1,000 jobs waiting), and each task it
#: claims by its id (its state compared as text, which `tasks_new` cannot answer: the update
#: was planned as a scan of every unclaimed new task, 1.7 ms a claim with 1,000 waiting).
#: The parameters: the met arrays, then job ids, host ids, counts, each assignment's devices
#: as a JSON array of arrays, and whether it is staged (beyond the host's free capacity).
_CLAIM: Final = f"""
WITH a AS (
    SELECT a.*, sum(a.n) OVER (PARTITION BY a.job_id ORDER BY a.ord) - a.n AS off
    FROM unnest($5::text[], $6::text[], $7::int[], $8::text[], $9::boolean[]) WITH ORDINALITY
        AS a(job_id, host, n, gpus, staged, ord)
), wanted AS (
    SELECT a.job_id, sum(a.n)::int AS total FROM a GROUP BY a.job_id
), picked AS (
    SELECT w.job_id, p.id, row_number() OVER (PARTITION BY w.job_id ORDER BY p.index) AS k,
        j.xmin::text::bigint AS job_version, j.owner_id, j.req_millicpus, j.req_memory_mb,
        j.req_gpus
    FROM wanted w CROSS JOIN LATERAL (
        SELECT j.id, j.state, j.xmin, j.owner_id, j.req_millicpus, j.req_memory_mb, j.req_gpus
        FROM jobs j WHERE j.id = w.job_id OFFSET 0) j
    CROSS JOIN LATERAL (
        SELECT t.id, t.index FROM tasks t WHERE {_releasable(1)}
        ORDER BY t.index LIMIT w.total) p
    WHERE {_PLACEABLE}
), dealt AS (
    SELECT p.id, a.host, a.gpus::jsonb -> (p.k - a.off - 1)::int AS gpus, a.staged,
        p.job_version,
        p.owner_id, p.req_millicpus, p.req_memory_mb, p.req_gpus
    FROM picked p JOIN a ON a.job_id = p.job_id AND p.k > a.off AND p.k <= a.off + a.n
), claimed AS (
    UPDATE tasks t SET claim = gen_random_uuid(), host = p.host, updated_at = now(),
        gpu_ids = CASE WHEN jsonb_array_length(coalesce(p.gpus, '[]')) = 0 THEN NULL
                  ELSE ARRAY(SELECT jsonb_array_elements_text(p.gpus)) END,
        hold_owner = p.owner_id, hold_millicpus = p.req_millicpus,
        hold_memory_mb = p.req_memory_mb, hold_gpus = p.req_gpus, staged = p.staged
    FROM dealt p
    WHERE t.id = p.id AND t.claim IS NULL AND t.state::text = 'new'
    RETURNING t.id, t.job_id, t.index, t.host, t.claim, t.staged, to_jsonb(t) AS row,
        p.job_version
), queued AS (
    INSERT INTO outbox (exchange, routing_key, body)
    SELECT 'work', 'host.' || c.host,
        work_body_run_stage(
            job_id => c.job_id, task_id => c.id, stage => 'setup', claim => c.claim,
            claimed => c.row, job_version => c.job_version,
            job => CASE WHEN c.index = 0
                   THEN (SELECT to_jsonb(j) FROM jobs j WHERE j.id = c.job_id) END)
    FROM claimed c ORDER BY c.staged, c.id
)
SELECT count(*) FROM claimed
"""


@dataclass(frozen=True)
class Claim:
    """`count` tasks of a job for a host, each with its GPU devices (empty: none)."""

    job_id: str
    host_id: str
    count: int
    gpu_ids: tuple[tuple[str, ...], ...] = ()
    #: Handed beyond the host's free capacity (the prefetch): `tasks.staged`.
    staged: bool = False


async def claim(conn: Connection, claims: Sequence[Claim]) -> int:
    """Claim the tasks of `claims` for their hosts and queue their work messages; how many
    were claimed (fewer when some were taken meanwhile: a cancel, a suspend, another claim).
    Each message carries the task's row as claimed and its job's row version
    (`RunStage.claimed`, `job_version`), so that a worker that knows the job at that version
    takes it without a read; that of a job's first input carries the job's row too
    (`RunStage.job`: a job of one task is taken without a read). Locks: the row of each task
    it claims."""
    if not claims:
        return 0
    count = await conn.fetchval(
        _CLAIM,
        *met_arrays(),
        [c.job_id for c in claims],
        [c.host_id for c in claims],
        [c.count for c in claims],
        [json.dumps([list(g) for g in c.gpu_ids]) for c in claims],
        [c.staged for c in claims],
    )
    return int(count)


async def write_waits(
    conn: Connection, waits: Mapping[str, tuple[str, str, str]], gone: Sequence[str]
) -> None:
    """Upsert each job's reason (`waits`: job id -> reason, message, detail as JSON) and
    delete the rows of jobs in `gone` (nothing waits any more, or it waits on its own
    tasks' prerequisites). Locks: those rows of `job_waits`."""
    if waits:
        await conn.execute(
            "INSERT INTO job_waits (job_id, reason, message, detail, at)"
            " SELECT w.job_id, w.reason, w.message, w.detail::jsonb, now()"
            " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])"
            "   AS w(job_id, reason, message, detail)"
            " JOIN jobs j ON j.id = w.job_id"
            " ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason,"
            " message = excluded.message, detail = excluded.detail, at = excluded.at",
            list(waits),
            [w[0] for w in waits.values()],
            [w[1] for w in waits.values()],
            [w[2] for w in waits.values()],
        )
    if gone:
        await conn.execute("DELETE FROM job_waits WHERE job_id = ANY($1::text[])", list(gone))


async def clear_waits_but(conn: Connection, keep: Sequence[str]) -> None:
    """Delete every reason but those of `keep` (a new leader's first round: what the last
    one left may be stale). Locks: the rows it deletes."""
    await conn.execute("DELETE FROM job_waits WHERE job_id <> ALL($1::text[])", list(keep))


async def charge(conn: Connection, usage: Mapping[str, float]) -> None:
    """Set each user's decayed usage as of now (`fairshare.charged`). Locks: their rows."""
    if usage:
        await conn.execute(
            "UPDATE users u SET usage = c.usage, usage_at = now()"
            " FROM unnest($1::text[], $2::float8[]) AS c(id, usage) WHERE u.id = c.id",
            list(usage),
            list(usage.values()),
        )


#: New tasks claimed for a host whose worker is gone (no worker, or silent for the dead-host
#: time) and not taken yet: their claims are given back, so that the next round places them
#: elsewhere. A message left in that host's queue is then stale (its claim fences it).
_GIVE_BACK: Final = """
UPDATE tasks t SET claim = NULL, gpu_ids = NULL, updated_at = now()
FROM hosts h
WHERE t.host = h.id AND t.state = 'new' AND t.claim IS NOT NULL AND t.worker IS NULL
  AND (h.worker IS NULL OR h.heartbeat_at < now() - make_interval(secs => $1))
RETURNING t.id
"""


async def give_back_from_gone_hosts(conn: Connection, dead_after_s: float) -> int:
    """Give back the claims of new tasks placed on hosts whose worker is gone; how many.
    Locks: the row of each task it changes."""
    return len(await conn.fetch(_GIVE_BACK, dead_after_s))
