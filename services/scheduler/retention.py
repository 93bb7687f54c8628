"""Retention (issue 6): purge the jobs whose `retention_s` ran out since they ended.

Runs with the scheduler's pruning, a batch per round; each purge is its own transaction
(`shared.harvest.purge_job`, actor `retention`). A job that cannot be purged now (reopened or
busy since it was found) is left for a later round.
"""

import logging
from typing import Final

from shared import harvest
from shared.db import Pool
from shared.errors import Conflict, NotFound

logger = logging.getLogger(__name__)

#: Who purges a job whose retention ran out (`jobs.purged_by`).
ACTOR: Final = "retention"


class Retention:
    """Purges up to `batch` jobs due for retention per round."""

    def __init__(self, pool: Pool, batch: int) -> None:
        self.pool = pool
        self.batch = batch

    async def run_once(self) -> int:
        """Purge the jobs due now (at most `batch`); returns how many were purged."""
        async with self.pool.acquire() as conn:
            due = await harvest.due_for_retention(conn, self.batch)
        purged = 0
        for job_id, retention_s in due:
            reason = f"retention: {retention_s:g} s after the job ended"
            try:
                async with self.pool.acquire() as conn:
                    await harvest.purge_job(conn, job_id, ACTOR, reason)
            except (Conflict, NotFound) as exc:  # changed since it was found
                logger.info("job %s not purged by retention: %s", job_id, exc)
                continue
            purged += 1
            logger.info(
                "job %s purged (%s)", job_id, reason, extra={"action": "purge", "job_id": job_id}
            )
        return purged
