"""What `GET /tasks/{id}` and `GET /jobs/{id}` read to say why a task or a job waits;
the decision itself is `shared.domain.waiting`'s, pure. Nothing is read for a
task that is not waiting."""

from datetime import UTC, datetime

from shared.domain.states import JobState, TaskState
from shared.domain.waiting import JobWaiting, TaskFacts, Why, job_waiting, task_waiting
from shared.store import emergency_repo, jobs_repo, waits_repo
from shared.store.db import Connection
from shared.store.jobs_repo import Job
from shared.store.tasks_repo import Task

#: The states in which a task can be waiting (the others run, rest after their command, or
#: have ended).
_WAITING_STATES = frozenset({TaskState.NEW, TaskState.ON_HOLD, TaskState.QUEUED})


async def of_task(conn: Connection, task: Task) -> Why | None:
    """Why `task` waits, or None."""
    if task.state not in _WAITING_STATES:
        return None
    facts = TaskFacts(
        state=task.state,
        claimed=task.claim is not None,
        host=task.host,
        test=task.test,
        not_before=task.not_before,
    )
    if task.state is not TaskState.NEW or facts.claimed:  # its own state says it all
        return task_waiting(
            facts,
            job_state=JobState.ACTIVE,
            stop_in_force=False,
            prerequisites=[],
            job_wait=None,
            now=datetime.now(UTC),
        )
    job = await jobs_repo.get(conn, task.job_id, with_counts=False)
    assert job is not None  # jobs are never deleted
    return task_waiting(
        facts,
        job_state=job.state,
        stop_in_force=await emergency_repo.in_force_id(conn) is not None,
        prerequisites=await waits_repo.setup_prerequisites(conn, task.id),
        job_wait=await waits_repo.job_wait(conn, task.job_id),
        now=await conn.fetchval("SELECT now()"),
    )


async def of_job(conn: Connection, job: Job) -> JobWaiting | None:
    """Why `job`'s tasks that wait to be placed wait (and how many), or None. `job` comes
    with its counts (`jobs_repo.get`): those waiting are its `new` tasks less those placed. A
    configuring job's are its test tasks; an ended job has none."""
    if job.state not in (JobState.ACTIVE, JobState.SUSPENDED, JobState.CONFIGURING):
        return None
    tests = job.state is JobState.CONFIGURING
    new = (job.test_counts if tests else job.counts).get(TaskState.NEW.value, 0)
    if not new:
        return None
    count = new - await waits_repo.placed_tasks(conn, job.id, tests=tests)
    if count <= 0:
        return None
    return job_waiting(
        job_state=job.state,
        stop_in_force=await emergency_repo.in_force_id(conn) is not None,
        waiting_tasks=count,
        job_wait=await waits_repo.job_wait(conn, job.id),
        has_prerequisites=bool(job.inputs_from or job.prerequisites.get("setup")),
    )
