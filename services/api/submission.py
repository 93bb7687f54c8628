"""Submitting a job: references checked, then job, tasks, events and prerequisites written in
one transaction, so that a failure anywhere leaves no trace (never a half-created job).
"""

import logging
from typing import Any

from fastapi.exceptions import RequestValidationError

from services.api import prerequisites, queries
from services.api.access import owner_filter
from services.api.errors import invalid
from services.api.schemas import JobCreate
from shared import jobs_repo
from shared.db import Connection, Pool
from shared.jobs_repo import Job
from shared.users_repo import User

logger = logging.getLogger(__name__)


async def submit(
    pool: Pool, user: User, body: JobCreate, idempotency_key: str | None
) -> tuple[Job, bool]:
    """Create the job (or find the one made earlier with `idempotency_key`); (job, created).

    Raises a 422 `RequestValidationError` naming any prerequisite task or `inputs_from` job that
    does not exist or that the user may not see; nothing is written then.
    """
    async with pool.acquire() as conn, conn.transaction():
        await _check_references(conn, user, body)
        job, created = await jobs_repo.create(conn, user.id, body.to_new_job(idempotency_key))
        if created:
            await prerequisites.insert_for_job(conn, job.id, body.prerequisites)
    if created:
        logger.info(
            "job submitted with %d task(s)",
            len(body.inputs),
            extra={"action": "submit", "job_id": job.id, "user": user.name},
        )
    return job, created


async def _check_references(conn: Connection, user: User, body: JobCreate) -> None:
    owner = owner_filter(user)
    errors: list[Any] = []
    wanted = sorted(body.prerequisites.referenced())
    found = await queries.visible_tasks(conn, wanted, owner) if wanted else set()
    for stage, spec in (
        ("setup", body.prerequisites.setup),
        ("post_processing", body.prerequisites.post_processing),
    ):
        for task_id in sorted(set(spec) - found):
            msg = f"prerequisite task {task_id!r} does not exist"
            errors.extend(invalid(("body", "prerequisites", stage, task_id), msg).errors())
    if body.inputs_from and not await queries.job_visible(conn, body.inputs_from, owner):
        msg = f"job {body.inputs_from!r} named in inputs_from does not exist"
        errors.extend(invalid(("body", "inputs_from"), msg).errors())
    if errors:
        raise RequestValidationError(errors)
