"""The scheduler's pilot pool on the real database (issue 40): what it counts as work waiting
for a host that a pilot could take (the pilots themselves on the real Slurm:
tests/e2e/test_pilots.py)."""

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from services.scheduler.pilots import PilotPool, PilotSettings
from shared.batch.slurm import Slurm
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pilot_database_url() -> Iterator[str]:
    with fresh_database("vigil_pilot_pool") as url:
        yield url


@pytest.fixture
async def pool(pilot_database_url: str) -> AsyncIterator[db.Pool]:
    async with db.open_pool(pilot_database_url, max_size=2) as pool:
        yield pool


async def _waiting(conn: db.Connection, cpus: float, gpus: int, tasks: int, reason: str) -> None:
    user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
    job, _ = await jobs_repo.create(conn, user.id, NewJob("w", "shell", "true", list(range(tasks))))
    await conn.execute(
        "UPDATE jobs SET req_millicpus = $2, req_gpus = $3 WHERE id = $1",
        job.id,
        round(cpus * 1000),
        gpus,
    )
    await conn.execute(
        "INSERT INTO job_waits (job_id, reason, message) VALUES ($1, $2, 'test')", job.id, reason
    )


async def test_only_work_a_pilot_could_run_asks_for_pilots(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        await _waiting(conn, cpus=1, gpus=0, tasks=3, reason="no_host")  # 3 cpus wanted
        await _waiting(conn, cpus=0.5, gpus=0, tasks=2, reason="resources")  # 1 more
        await _waiting(conn, cpus=8, gpus=0, tasks=5, reason="too_large")  # no pilot holds it
        await _waiting(conn, cpus=1, gpus=1, tasks=5, reason="no_host")  # nor a GPU
        await _waiting(conn, cpus=1, gpus=0, tasks=5, reason="fair_share")  # not for a host
    pilots = PilotPool(pool, Slurm(), PilotSettings(backend="slurm", worker_pool="p", cpus=2))

    assert await pilots._wanted_cpus() == pytest.approx(4.0)
