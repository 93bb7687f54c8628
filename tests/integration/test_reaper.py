"""The reaper on the real PostgreSQL: a host is dead when its worker and supervisor went silent,
or at once when the batch system reported its pilot's allocation ended (its processes went
with it): the tasks its worker held are lost, saying which."""

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from services.scheduler.reaper import Reaper
from shared.domain.scheduling.resources import Resources
from shared.store import db, hosts_repo, jobs_repo, users_repo
from shared.store.db import Connection
from shared.store.jobs_repo import NewJob
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration

DEAD_AFTER_S = 600.0  # far off: only an ended allocation makes these hosts dead


@pytest.fixture(scope="module")
def reaper_database_url() -> Iterator[str]:
    with fresh_database("vigil_reaper") as url:
        yield url


@pytest.fixture
async def rpool(reaper_database_url: str) -> AsyncIterator[db.Pool]:
    async with db.open_pool(reaper_database_url, max_size=2) as pool:
        yield pool


async def _running_on_a_live_host(conn: Connection, pilot_state: str) -> tuple[str, str]:
    """Given-step: a host beating now, a pilot's in `pilot_state`, whose worker holds a task
    on_cpu: (the host, the task)."""
    host_id, worker = f"pilot-{uuid.uuid4().hex[:8]}", f"w-{uuid.uuid4().hex[:8]}"
    await hosts_repo.register_worker(conn, host_id, worker, "default", Resources.of(1, 0))
    await conn.execute(
        "INSERT INTO pilots (id, pool, backend, state, host_id, cpus, walltime_s, requested_by)"
        " VALUES ('p-' || $1, 'default', 'slurm', $2, $1, 1, 60, 't')",
        host_id,
        pilot_state,
    )
    owner = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
    job, _ = await jobs_repo.create(
        conn, owner.id, NewJob("held", "shell", "sleep 600", ["a"], policy={"restartable": True})
    )
    task_id = await conn.fetchval(
        "UPDATE tasks SET claim = gen_random_uuid(), host = $2, worker = $3, state = 'on_cpu'"
        " WHERE job_id = $1 RETURNING id",
        job.id,
        host_id,
        worker,
    )
    return host_id, str(task_id)


async def test_a_pilot_whose_allocation_ended_is_dead_at_once_and_its_tasks_lost(
    rpool: db.Pool,
) -> None:
    async with rpool.acquire() as conn:
        host_id, task_id = await _running_on_a_live_host(conn, "ended")

    lost = await Reaper(rpool, DEAD_AFTER_S).run_once()

    task = await rpool.fetchrow(
        "SELECT state, failure_class, error_brief FROM tasks WHERE id = $1", task_id
    )
    assert lost >= 1 and task is not None
    assert (task["state"], task["failure_class"]) == ("failed_on_cluster", "lost")
    assert "batch allocation ended" in task["error_brief"]
    assert await rpool.fetchval("SELECT worker FROM hosts WHERE id = $1", host_id) is None


async def test_a_running_pilot_that_beats_is_left_alone(rpool: db.Pool) -> None:
    async with rpool.acquire() as conn:
        _, task_id = await _running_on_a_live_host(conn, "running")

    await Reaper(rpool, DEAD_AFTER_S).run_once()

    assert await rpool.fetchval("SELECT state FROM tasks WHERE id = $1", task_id) == "on_cpu"
