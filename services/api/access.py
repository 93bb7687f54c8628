"""Who may see what: users see their own jobs and tasks, operators everything (design §9).

Something another user owns is reported exactly like something that does not exist (404), so
ids cannot be probed.
"""

from services.api import queries
from shared.domain.errors import NotFound
from shared.store import jobs_repo, tasks_repo
from shared.store.db import Connection
from shared.store.jobs_repo import Job
from shared.store.tasks_repo import Task
from shared.store.users_repo import User


def owner_filter(user: User) -> str | None:
    """The owner id to restrict queries to: the user's own id, or None for an operator."""
    return None if user.is_operator else user.id


async def visible_job(conn: Connection, user: User, job_id: str) -> Job:
    """The job with its counts; raises `NotFound` when it is missing or not the user's."""
    job = await jobs_repo.get(conn, job_id)
    if job is None or not (user.is_operator or job.owner_id == user.id):
        raise NotFound(f"job {job_id!r} not found")
    return job


async def check_visible(conn: Connection, user: User, job_id: str) -> None:
    """`NotFound` unless the job exists and is the user's (an operator's: any job). Its task
    counts are not read: a page of a 100,000-task job's tasks or logs does not count them."""
    owner = await conn.fetchval("SELECT owner_id FROM jobs WHERE id = $1", job_id)
    if owner is None or not (user.is_operator or owner == user.id):
        raise NotFound(f"job {job_id!r} not found")


async def visible_task(conn: Connection, user: User, task_id: str) -> Task:
    """The task; raises `NotFound` when it is missing or belongs to another user's job."""
    task = await tasks_repo.get(conn, task_id)
    if task is None or not await queries.job_visible(conn, task.job_id, owner_filter(user)):
        raise NotFound(f"task {task_id!r} not found")
    return task
