"""Releasing tasks to workers: claim (compare-and-set) and a work message, in one transaction.

New tasks whose setup prerequisites are met (and whose resubmission backoff, `not_before`, has
passed) go to the pool queue, within each job's `release_per_tick` and `max_in_flight` (1 while
the job is probing); a configuring job has only test tasks, released the same way. Unclaimed
tasks resting in `queued` or `data_ready`
(after a recovery, or once post-processing prerequisites are met), or in an action state
(`recover_*`, `restart_*`: a hook to run), go to their host's queue, since their work dir
lives there.
"""

from typing import Final
from uuid import UUID

from shared import outbox, sql_states
from shared.db import Connection, Pool
from shared.messages import RunStage
from shared.prerequisites import met_arrays, unmet_sql
from shared.states import ACTIONS, Stage, TaskState
from shared.topology import host_key, pool_key

#: An emergency stop suspends active jobs; a configuring job has no suspended state, so its
#: test tasks are simply not released while a stop is in force.
_NOT_STOPPED: Final = "NOT EXISTS (SELECT 1 FROM emergency_stops WHERE resumed_at IS NULL)"

#: A job's new tasks to release now, within its throttles; `{jobs}` picks the jobs. Jobs are
#: read oldest first through `jobs_active` / `jobs_configuring`; each is probed for one
#: unclaimed new task (`tasks_new`, an index scan per job: the LATERAL keeps the planner from
#: reading the whole index, dead entries of finished big jobs included, into a hash), and only
#: those that have one are opened, their tasks in flight counted on `tasks_in_flight`. A round
#: costs a probe per active job plus what it releases, not the size of the jobs.
_NEW_OF = f"""
SELECT t.id FROM (
    SELECT j.id, j.state, j.release_per_tick, j.max_in_flight, j.probing_since FROM jobs j
    CROSS JOIN LATERAL (
        SELECT 1 FROM tasks n WHERE n.job_id = j.id AND n.claim IS NULL AND n.state = 'new'
        LIMIT 1) has_new
    WHERE {{jobs}}
    ORDER BY j.created_at
) j CROSS JOIN LATERAL (
    SELECT t.id FROM tasks t
    WHERE t.job_id = j.id AND t.state = 'new' AND t.claim IS NULL
      AND (NOT t.test OR j.state = 'configuring')
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND NOT {unmet_sql("setup")}
    ORDER BY t.index
    LIMIT greatest(0, least(j.release_per_tick, (
        CASE WHEN j.probing_since IS NULL THEN j.max_in_flight ELSE 1 END) - (
        SELECT count(*) FROM tasks x WHERE x.job_id = j.id
          AND (x.claim IS NOT NULL OR x.state NOT IN {sql_states.NOT_IN_FLIGHT}))))
) t
LIMIT $1
"""

_NEW_TASKS: Final = (
    "("
    + _NEW_OF.format(jobs="j.state = 'active'")
    + ") UNION ALL ("
    + _NEW_OF.format(jobs=f"j.state = 'configuring' AND {_NOT_STOPPED}")
    + ")"
)

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

_CLAIM: Final = """
UPDATE tasks SET claim = gen_random_uuid(), updated_at = now()
WHERE id = ANY($1) AND claim IS NULL
  AND (state IN ('new', 'queued', 'data_ready') OR state = ANY($2::task_state[]))
RETURNING id, job_id, state, host, claim
"""

_STAGE_OF: Final = {
    "new": Stage.SETUP,
    "queued": Stage.CLUSTER,
    "data_ready": Stage.POST_PROCESSING,
    **{action.value: Stage.HOOK for action in ACTIONS},
}
_ACTION_STATES: Final = sorted(action.value for action in ACTIONS)


class Dispatcher:
    """Claims releasable tasks and writes their work messages to the outbox."""

    def __init__(self, pool: Pool, batch: int, worker_pool: str) -> None:
        self._pool, self._batch, self._worker_pool = pool, batch, worker_pool

    async def run_once(self) -> int:
        """Release one batch of new tasks and one of resting tasks; returns how many."""
        args = [self._batch, *met_arrays()]
        async with self._pool.acquire() as conn, conn.transaction():
            new = await conn.fetch(_NEW_TASKS, *args)
            resting = await conn.fetch(_RESTING_TASKS, *args)
            ids = [r["id"] for r in new] + [r["id"] for r in resting]
            return await self._claim(conn, ids) if ids else 0

    async def _claim(self, conn: Connection, ids: list[str]) -> int:
        claimed = await conn.fetch(_CLAIM, ids, _ACTION_STATES)
        messages: list[tuple[str, RunStage]] = []
        for row in claimed:
            stage = _STAGE_OF[str(row["state"])]
            key = pool_key(self._worker_pool) if stage is Stage.SETUP else host_key(row["host"])
            message = RunStage(
                job_id=row["job_id"], task_id=row["id"], stage=stage, claim=UUID(str(row["claim"]))
            )
            messages.append((key, message))
        await outbox.add_work_many(conn, messages)
        return len(claimed)
