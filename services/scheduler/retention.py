"""Retention: purge the jobs whose `retention_s` ran out since they ended, and finish
the purges cut short.

Runs with the scheduler's pruning, a batch per round; each purge marks its job in a short
transaction and clears its data in batches (`shared.operations.harvest.purge_job`, actor
`retention`). A
job that cannot be purged now (reopened or busy since it was found) is left for a later round.
A job marked purged whose clearing did not finish (its purger stopped half-way) for
`UNFINISHED_AFTER_S` (or whose outputs the object store failed to delete) is cleared here.
"""

import logging
from typing import Final

from shared.domain.errors import Conflict, NotFound
from shared.objects import ObjectStore, ObjectStoreError
from shared.operations import harvest
from shared.store.db import Pool

logger = logging.getLogger(__name__)

#: Who purges a job whose retention ran out (`jobs.purged_by`).
ACTOR: Final = "retention"
#: A purge whose clearing has not finished this long after the job was marked was cut short.
UNFINISHED_AFTER_S: Final = 60.0


class Retention:
    """Purges up to `batch` jobs due for retention per round."""

    def __init__(self, pool: Pool, batch: int, store: ObjectStore) -> None:
        self.pool = pool
        self.batch = batch
        self.store = store

    async def run_once(self) -> int:
        """Purge the jobs due now (at most `batch`), and finish purges cut short; returns how
        many jobs were purged or cleared."""
        async with self.pool.acquire() as conn:
            unfinished = await harvest.unfinished_purges(conn, UNFINISHED_AFTER_S, self.batch)
            for job_id in unfinished:
                try:
                    cleared = await harvest.clear_purged(conn, job_id, self.store)
                except ObjectStoreError as exc:  # left for a later round
                    logger.warning("job %s: purge not finished: %s", job_id, exc)
                    continue
                logger.info(
                    "job %s: purge finished (%d log lines, %d outputs, %d objects, %d removals)",
                    job_id,
                    cleared.logs,
                    cleared.contents,
                    cleared.objects,
                    cleared.removals,
                    extra={"action": "purge", "job_id": job_id},
                )
            due = await harvest.due_for_retention(conn, self.batch)
        purged = len(unfinished)
        for job_id, retention_s in due:
            reason = f"retention: {retention_s:g} s after the job ended"
            try:
                async with self.pool.acquire() as conn:
                    await harvest.purge_job(conn, job_id, ACTOR, reason, self.store)
            except (Conflict, NotFound) as exc:  # changed since it was found
                logger.info("job %s not purged by retention: %s", job_id, exc)
                continue
            except ObjectStoreError as exc:  # marked: its clearing is finished later
                logger.warning("job %s: purge not finished: %s", job_id, exc)
            purged += 1
            logger.info(
                "job %s purged (%s)", job_id, reason, extra={"action": "purge", "job_id": job_id}
            )
        return purged
