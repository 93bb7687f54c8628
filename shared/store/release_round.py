"""The release round's one statement: it claims releasable tasks (compare-and-set on
`tasks.claim`: still unclaimed, still resting) and writes each one's `RunStage` to the outbox.
The home of the dispatcher's writes (`services/scheduler/dispatcher.py` runs it each round);
what it releases, and in which order, is said there.

Locks: the row lock of each task it claims, for the statement's own transaction.
"""

from dataclasses import dataclass
from typing import Final

from shared.domain.prerequisites import met_arrays, unmet_sql
from shared.domain.states import ACTIONS, Stage, TaskState
from shared.store import emergency_repo, jobs_repo, sql_states
from shared.store.db import GENERIC_PLANS, Connection

#: An emergency stop suspends active jobs; a configuring job has no suspended state, so its
#: test tasks are simply not released while a stop is in force.
_NOT_STOPPED: Final = "NOT EXISTS (SELECT 1 FROM emergency_stops WHERE resumed_at IS NULL)"

#: A job's new tasks to release now, within its throttles; `{jobs}` picks the jobs. Jobs are
#: read oldest first through `jobs_active` / `jobs_configuring`; each is probed for its first
#: unclaimed new task (`tasks_new`, an index scan per job: the LATERAL keeps the planner from
#: reading the whole index, dead entries of finished big jobs included, into a hash, and the
#: order from reading the table from its start, through every task the job already ran, where
#: the statistics say that most of a big job's tasks are new), and only those that have one
#: are opened, their tasks in flight counted on `tasks_in_flight`. A round costs a probe per
#: active job plus what it releases, not the size of the jobs.
#:
#: Fair share (issue 17): each job with new tasks offers at most its share of the batch ($1
#: over the number of such jobs, so that a round numbers about a batch of candidates, not
#: every job's whole backlog); the candidates are numbered per owner (`nth`: their jobs oldest
#: first, each job's tasks in order), released in that order across owners (every owner's
#: first, then every owner's second...), and an owner gets no more than the per-user cap
#: ($cap, NULL: none) minus what they have in flight (`owner_load`, a CTE of `_ROUND`).
_NEW_OF = f"""
SELECT r.id FROM (
    SELECT t.id, j.owner_id, j.created_at,
        row_number() OVER (PARTITION BY j.owner_id ORDER BY j.created_at, j.id, t.index) AS nth
    FROM (
        SELECT j.id, j.owner_id, j.created_at, j.state, j.release_per_tick, j.max_in_flight,
            j.probing_since, count(*) OVER () AS jobs
        FROM jobs j
        CROSS JOIN LATERAL (
            SELECT 1 FROM tasks n WHERE n.job_id = j.id AND n.claim IS NULL AND n.state = 'new'
            ORDER BY n.index LIMIT 1) has_new
        WHERE {{jobs}} AND ({{cap}}::bigint IS NULL OR {{cap}}::bigint > coalesce(
            (SELECT l.n FROM owner_load l WHERE l.owner_id = j.owner_id), 0))
    ) j CROSS JOIN LATERAL (
        SELECT t.id, t.index FROM tasks t
        WHERE t.job_id = j.id AND t.state = 'new' AND t.claim IS NULL
          AND (NOT t.test OR j.state = 'configuring')
          AND (t.not_before IS NULL OR t.not_before <= now())
          AND NOT {unmet_sql("setup")}
        ORDER BY t.index
        LIMIT greatest(0, least(($1 + j.jobs - 1) / j.jobs, j.release_per_tick, (
            CASE WHEN j.probing_since IS NULL THEN j.max_in_flight ELSE 1 END) - (
            SELECT count(*) FROM tasks x WHERE x.job_id = j.id
              AND (x.claim IS NOT NULL OR x.state NOT IN {sql_states.NOT_IN_FLIGHT}))))
    ) t
) r
WHERE {{cap}}::bigint IS NULL OR r.nth <= {{cap}}::bigint - coalesce(
    (SELECT l.n FROM owner_load l WHERE l.owner_id = r.owner_id), 0)
ORDER BY r.nth, r.created_at, r.id
LIMIT $1
"""


def _new_tasks(cap: str) -> str:
    """The new tasks to release of active jobs, then of configuring ones (test tasks)."""
    return (
        "("
        + _NEW_OF.format(jobs="j.state = 'active'", cap=cap)
        + ") UNION ALL ("
        + _NEW_OF.format(jobs=f"j.state = 'configuring' AND {_NOT_STOPPED}", cap=cap)
        + ")"
    )


#: Tasks in flight per owner, over all their jobs (`tasks_in_flight`: what runs or is claimed).
#: The owner is a probe of `jobs` per task in flight (a join would read every job ever made).
_OWNER_LOAD: Final = f"""
SELECT (SELECT j.owner_id FROM jobs j WHERE j.id = x.job_id) AS owner_id, count(*) AS n
FROM tasks x WHERE x.claim IS NOT NULL OR x.state NOT IN {sql_states.NOT_IN_FLIGHT}
GROUP BY 1
"""

#: Unclaimed states with work for the task's host; the partial index `tasks_resting`
#: (migration 0003) lists the same states, so that this query never scans finished tasks.
RESTING_STATES: Final = (TaskState.QUEUED, TaskState.DATA_READY, *ACTIONS)
_RESTING_LIST: Final = ", ".join(f"'{s.value}'" for s in RESTING_STATES)

_RESTING_TASKS: Final = f"""
SELECT t.id FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.claim IS NULL AND t.state IN ({_RESTING_LIST})
  AND t.host IS NOT NULL AND (j.state = 'active' OR (j.state = 'configuring' AND {_NOT_STOPPED}))
  AND (NOT t.test OR j.state = 'configuring')
  AND (t.state <> 'data_ready' OR NOT {unmet_sql("post_processing")})
LIMIT $1
"""

#: The stage a claimed task's work message asks for, by the state it rests in.
_STAGE_OF: Final = {
    "new": Stage.SETUP,
    "queued": Stage.CLUSTER,
    "data_ready": Stage.POST_PROCESSING,
    **{action.value: Stage.HOOK for action in ACTIONS},
}
_ACTION_STATES: Final = sorted(action.value for action in ACTIONS)
_STAGE_SQL: Final = (
    "CASE c.state::text "
    + " ".join(f"WHEN '{state}' THEN '{stage.value}'" for state, stage in _STAGE_OF.items())
    + " END"
)

#: A round in one statement: pick the releasable tasks, claim them (compare-and-set: still
#: unclaimed, still resting), and queue each one's `RunStage` (made here as `RunStage` would
#: write it: `tests/integration/test_dispatcher.py` reads it back through the model): new tasks
#: to the pool queue ($N: its routing key), the others to their host's queue.
_ROUND: Final = f"""
WITH owner_load AS MATERIALIZED ({_OWNER_LOAD}
), picked AS (
    {{picked}}
), claimed AS (
    UPDATE tasks t SET claim = gen_random_uuid(), updated_at = now()
    WHERE t.id = ANY(ARRAY(SELECT p.id FROM picked p)) AND t.claim IS NULL
      AND (t.state IN ('new', 'queued', 'data_ready') OR t.state = ANY({{actions}}::task_state[]))
    RETURNING t.id, t.job_id, t.state, t.host, t.claim
), queued AS (
    INSERT INTO outbox (exchange, routing_key, body)
    SELECT 'work',
        CASE WHEN c.state = 'new' THEN {{pool_key}} ELSE 'host.' || c.host END,
        jsonb_build_object(
            'message_id', gen_random_uuid(), 'sent_at', now(), 'type', 'run_stage',
            'job_id', c.job_id, 'task_id', c.id, 'stage', {_STAGE_SQL}, 'claim', c.claim)
    FROM claimed c ORDER BY c.id
)
SELECT count(*){{result}} FROM claimed
"""


def statement() -> str:
    """The round, its parameters: the batch, the arrays of met states (`met_arrays()`), the
    action states, the pool's routing key and the per-user cap (None: none); it returns how
    many tasks it released and whether any was waiting (`_WAITING`). Its locks: the row of
    each task it claims (its UPDATE, in no set order); the rows it reads are not."""
    n = 1 + len(met_arrays())
    picked = f"({_new_tasks(cap=f'${n + 3}')}) UNION ALL ({_RESTING_TASKS})"
    return _ROUND.format(
        picked=picked, actions=f"${n + 1}", pool_key=f"${n + 2}", result=f", {_WAITING}"
    )


def _waiting_in(job_state: str, tasks: str, order: str | None = None) -> str:
    """Whether a job in `job_state` has a task matching `tasks`: a probe per job (LIMIT 1 in a
    LATERAL, so that the planner never hashes the whole index instead), the first in `order`
    if given (the order of the index that answers it, so that no plan reads the table from
    its start instead: see `_NEW_OF`)."""
    ordered = f" ORDER BY {order}" if order else ""
    return (
        f"EXISTS (SELECT 1 FROM jobs j CROSS JOIN LATERAL (SELECT 1 FROM tasks t"
        f" WHERE t.job_id = j.id AND t.claim IS NULL AND {tasks}{ordered} LIMIT 1) x"
        f" WHERE j.state = '{job_state}')"
    )


#: Whether any active or configuring job has a task resting unclaimed (new, or with work for
#: its host), releasable or not (a throttle, a cap, a prerequisite, a backoff, a stop): a probe
#: of `tasks_new` and `tasks_resting` per such job. Seen before this statement's claims, so it
#: is true when the statement released anything. When it is false, nothing becomes
#: releasable but what is announced (`services/scheduler/main.py`, `Scheduler.release_due`).
_WAITING: Final = (
    "("
    + " OR ".join(
        _waiting_in(job_state, tasks, order)
        for job_state in ("active", "configuring")
        for tasks, order in (
            ("t.state = 'new'", "t.index"),  # tasks_new: (job_id, index), most of a big job
            (f"t.state IN ({_RESTING_LIST})", None),  # tasks_resting: few, by job
        )
    )
    + ")"
)


def job_statement() -> str:
    """The round for one active job's new tasks (`release_job`): the parameters of
    `statement()`, then the job's id. The same rule: its throttles, its prerequisites, its
    owner's cap (which a caller racing other releases cannot keep: `submission.submit`), an
    emergency stop (nothing is released while one is in force; the statement says which)."""
    n = 1 + len(met_arrays())
    # The state as text: `j.state = 'active'` would let the planner read the job through the
    # partial index `jobs_active`, whole, the id a filter (see `jobs_repo.BY_ID_ACTIVE`).
    jobs = f"j.id = ${n + 4} AND {jobs_repo.BY_ID_ACTIVE} AND {_NOT_STOPPED}"
    picked = _NEW_OF.format(jobs=jobs, cap=f"${n + 3}")
    return _ROUND.format(
        picked=picked,
        actions=f"${n + 1}",
        pool_key=f"${n + 2}",
        result=f", ({emergency_repo.IN_FORCE})",
    )


_JOB_STATEMENT: Final = job_statement()

#: How many of a job's tasks its submission releases at most (its throttles bound it first).
SUBMISSION_BATCH: Final = 500


@dataclass(frozen=True)
class Released:
    """What a round's release did: how many tasks it released, and whether any task was
    waiting to be (`_WAITING`: true when it released some)."""

    released: int
    waiting: bool


async def release(
    conn: Connection, query: str, batch: int, pool_key: str, per_user: int | None
) -> Released:
    """Run the round (`statement()`), with one plan per connection (`db.GENERIC_PLANS`: it
    was planned anew at one round in four, 0.9 ms of planning for 0.6 ms of work). Locks: the
    row of each task it claims, until the transaction ends."""
    async with conn.transaction():
        await conn.execute(f"SELECT {GENERIC_PLANS}")
        row = await conn.fetchrow(query, batch, *met_arrays(), _ACTION_STATES, pool_key, per_user)
    assert row is not None  # an aggregate: one row
    return Released(int(row[0]), bool(row[1]))


@dataclass(frozen=True)
class JobRelease:
    """What `release_job` did: how many tasks it released, and the emergency stop in force
    (None: none), which released nothing."""

    released: int
    stop_id: int | None


async def release_job(
    conn: Connection, job_id: str, pool_key: str, per_user: int | None
) -> JobRelease:
    """Release what the round would of one active job's new tasks, in the caller's
    transaction (a submission's: its first tasks go out without waiting for a round), and
    say whether a stop is in force: one round trip for both (the caller, holding the stop
    lock shared, then suspends the job: `stop_guard`). Locks: the row of each task it claims,
    until the transaction ends."""
    row = await conn.fetchrow(
        _JOB_STATEMENT,
        SUBMISSION_BATCH,
        *met_arrays(),
        _ACTION_STATES,
        pool_key,
        per_user,
        job_id,
    )
    assert row is not None  # an aggregate: one row
    return JobRelease(int(row[0]), row[1])
