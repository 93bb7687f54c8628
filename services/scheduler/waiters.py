"""Tasks waiting on prerequisites that can no longer be met (design §4) are failed.

A task waits unclaimed in `new` (setup prerequisites) or `data_ready` (post-processing ones).
When a task it waits for reaches a state from which the required one is out of reach (and, if
failed, the triage has decided it will not come back), it goes
to `failed_setup_prerequisites` / `failed_post_processing_prerequisites`, with a brief naming
the prerequisite. `recover` puts it back, and its prerequisites are evaluated again.
"""

import logging
from typing import Final

from shared.domain.errors import StaleState
from shared.domain.prerequisites import UNMEETABLE, Required
from shared.domain.states import TaskState
from shared.store import tasks_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)

_STUCK: Final = """
SELECT DISTINCT ON (t.id) t.id, t.state, p.stage, p.on_task_id, p.required, o.state AS other
FROM tasks t
JOIN task_prerequisites p ON p.task_id = t.id
JOIN tasks o ON o.id = p.on_task_id
WHERE t.claim IS NULL AND o.decided
  AND ((t.state = 'new' AND p.stage = 'setup')
       OR (t.state = 'data_ready' AND p.stage = 'post_processing'))
  AND ((p.required = 'queued' AND o.state = ANY($2::task_state[]))
       OR (p.required = 'data_ready' AND o.state = ANY($3::task_state[]))
       OR (p.required = 'completed' AND o.state = ANY($4::task_state[]))
       OR (p.required = 'failed' AND o.state = ANY($5::task_state[])))
ORDER BY t.id
LIMIT $1
"""

_FAILED_STATE: Final = {
    "setup": TaskState.FAILED_SETUP_PREREQUISITES,
    "post_processing": TaskState.FAILED_POST_PROCESSING_PREREQUISITES,
}


class Waiters:
    """Fails waiting tasks whose prerequisites are out of reach."""

    def __init__(self, pool: Pool, batch: int) -> None:
        self._pool, self._batch = pool, batch

    async def run_once(self) -> int:
        """Fail one batch of stuck waiters; returns how many."""
        unmeetable = [sorted(s.value for s in UNMEETABLE[r]) for r in Required]
        failed = 0
        async with self._pool.acquire() as conn:
            for row in await conn.fetch(_STUCK, self._batch, *unmeetable):
                brief = (
                    f"{row['stage']} prerequisite {row['on_task_id']} is {row['other']}:"
                    f" it can no longer be {row['required']}"
                )
                try:
                    await tasks_repo.transition(
                        conn,
                        row["id"],
                        _FAILED_STATE[row["stage"]],
                        among=frozenset({TaskState(row["state"])}),
                        claim=tasks_repo.UNCLAIMED,
                        changes={"error_brief": brief},
                    )
                except StaleState:
                    continue
                logger.info("task %s: %s", row["id"], brief, extra={"task_id": row["id"]})
                failed += 1
        return failed
