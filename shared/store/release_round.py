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
from shared.store import loose_scan
from shared.store.db import Connection

#: An emergency stop suspends active jobs; a configuring job has no suspended state, so its
#: test tasks are simply not released while a stop is in force.
_NOT_STOPPED: Final = "NOT EXISTS (SELECT 1 FROM emergency_stops WHERE resumed_at IS NULL)"

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

#: A round in one statement: pick the releasable resting tasks, claim them (compare-and-set:
#: still unclaimed, still resting), and queue each one's `RunStage` (its body made by
#: `work_body_run_stage`: `tests/integration/test_dispatcher.py` reads it back through the
#: model) to their host's queue.
_ROUND: Final = f"""
WITH RECURSIVE {{waiting_jobs}}, picked AS (
    {{picked}}
), claimed AS (
    UPDATE tasks t SET claim = gen_random_uuid(), staged = false, updated_at = now()
    WHERE t.id = ANY(ARRAY(SELECT p.id FROM picked p)) AND t.claim IS NULL
      AND (t.state IN ('queued', 'data_ready') OR t.state = ANY({{actions}}::task_state[]))
    RETURNING t.id, t.job_id, t.state, t.host, t.claim
), queued AS (
    INSERT INTO outbox (exchange, routing_key, body)
    SELECT 'work',
        'host.' || c.host,
        work_body_run_stage(
            job_id => c.job_id, task_id => c.id, stage => {_STAGE_SQL}, claim => c.claim)
    FROM claimed c ORDER BY c.id
)
SELECT count(*){{result}} FROM claimed
"""


def statement() -> str:
    """The round, its parameters: the batch, the arrays of met states (`met_arrays()`) and
    the action states; it returns how many tasks it released and whether any task was
    waiting (`_WAITING`). Its locks: the row of each task it claims (its UPDATE, in no set
    order); the rows it reads are not."""
    n = 1 + len(met_arrays())
    return _ROUND.format(
        waiting_jobs=_WAITING_JOBS,
        picked=_RESTING_TASKS,
        actions=f"${n + 1}",
        result=f", {_WAITING}",
    )


#: The jobs with a task resting unclaimed: new (`tasks_new`), or with work for its host
#: (`tasks_resting`), each read by a loose index scan (`loose_scan`): one descent a job that
#: has one, none for the others.
_WAITING_JOBS: Final = (
    loose_scan.jobs_with("new_of", loose_scan.NEW)
    + ", "
    + loose_scan.jobs_with("resting_of", f"t.claim IS NULL AND t.state IN ({_RESTING_LIST})")
)

#: Whether any active or configuring job has a task resting unclaimed (new, or with work for
#: its host), releasable or not (a throttle, a cap, a prerequisite, a backoff, a stop): the
#: jobs that have one (`_WAITING_JOBS`), in job order, until one is active or configuring,
#: each looked up by its id (a subquery per row: a join was planned, from some statistics,
#: as a hash of every job found against a scan of every job, history included: 4.5 ms a
#: round with 1,000 jobs waiting and 5,000 ended). (A probe per active job read every one of
#: them when none waited: 1 ms a round with 1,300 one-task jobs running.) Seen before this
#: statement's claims, so it is true when the statement released anything. When it is
#: false, nothing becomes releasable but what is announced (`services/scheduler/main.py`,
#: `Scheduler.release_due`).
_WAITING: Final = """EXISTS (
    SELECT 1 FROM (SELECT job_id FROM new_of UNION ALL SELECT job_id FROM resting_of) w
    WHERE (SELECT j.state IN ('active', 'configuring') FROM jobs j WHERE j.id = w.job_id))"""


@dataclass(frozen=True)
class Released:
    """What a round's release did: how many tasks it released, and whether any task was
    waiting to be (`_WAITING`: true when it released some)."""

    released: int
    waiting: bool


async def release(conn: Connection, query: str, batch: int) -> Released:
    """Run the round (`statement()`) in the caller's transaction, which keeps one plan per
    connection (`db.GENERIC_PLANS`: the statement was planned anew at one round in four, 0.9
    ms of planning for 0.6 ms of work): the dispatcher's round. Locks: the row of each task
    it claims, until the transaction ends."""
    if not conn.is_in_transaction():
        raise RuntimeError("a release runs in its round's transaction, with generic plans")
    row = await conn.fetchrow(query, batch, *met_arrays(), _ACTION_STATES)
    assert row is not None  # an aggregate: one row
    return Released(int(row[0]), bool(row[1]))
