"""The scheduler's pilot pool on the real database: what it counts as work waiting
for a host that a pilot could take (the pilots themselves on the real Slurm:
tests/e2e/test_pilots.py)."""

import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.scheduler import stop_pilots
from services.scheduler.pilots import PilotPool, PilotPoolSettings
from shared.batch.slurm import BatchJob, Slurm
from shared.store import db, jobs_repo, pilots_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import fresh_database
from tests.integration.test_slurm_client import submit, until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pilot_database_url() -> Iterator[str]:
    with fresh_database("vigil_pilot_pool") as url:
        yield url


@pytest.fixture
async def pool(pilot_database_url: str) -> AsyncIterator[db.Pool]:
    """This module's database, with no work waiting (each test says what waits)."""
    async with db.open_pool(pilot_database_url, max_size=2) as pool:
        await pool.execute("DELETE FROM job_waits")
        yield pool


async def _waiting(
    conn: db.Connection, cpus: float, gpus: int, tasks: int, reason: str
) -> jobs_repo.Job:
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
    return job


async def test_only_work_a_pilot_could_run_asks_for_pilots(pool: db.Pool) -> None:
    async with pool.acquire() as conn:
        await _waiting(conn, cpus=1, gpus=0, tasks=3, reason="no_host")  # 3 cpus wanted
        await _waiting(conn, cpus=0.5, gpus=0, tasks=2, reason="resources")  # 1 more
        await _waiting(conn, cpus=8, gpus=0, tasks=5, reason="too_large")  # no pilot holds it
        await _waiting(conn, cpus=1, gpus=1, tasks=5, reason="no_host")  # nor a GPU
        await _waiting(conn, cpus=1, gpus=0, tasks=5, reason="fair_share")  # not for a host
    pilots = PilotPool(pool, Slurm(), PilotPoolSettings(backend="slurm", worker_pool="p", cpus=2))

    assert await pilots._wanted_cpus() == pytest.approx(4.0)


async def test_work_waiting_for_a_host_that_lasts_asks_for_pilots_only_if_one_would(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        fits = await _waiting(conn, cpus=1, gpus=0, tasks=2, reason="host_ends")
        longer = await _waiting(conn, cpus=1, gpus=0, tasks=3, reason="host_ends")
        unknown = await _waiting(conn, cpus=1, gpus=0, tasks=4, reason="host_ends")
        for job, runs_s in ((fits, 500), (longer, 900), (unknown, None)):
            await conn.execute(
                "UPDATE job_waits SET detail = jsonb_build_object('runs_s', $2::float8)"
                " WHERE job_id = $1",
                job.id,
                runs_s,
            )
    settings = PilotPoolSettings(backend="slurm", worker_pool="p", walltime_s=600)
    pilots = PilotPool(pool, Slurm(), settings)

    # a pilot of 600 s runs tasks for 570 s: only the first job's would end on one
    assert settings.runs_up_to_s == 570
    assert await pilots._wanted_cpus() == pytest.approx(2.0)


@dataclass
class _Batch:
    """A batch system that keeps its jobs in memory: each submitted job pends, with an end
    the batch system guesses, until `run` starts it."""

    known: dict[str, BatchJob] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)

    async def submit(self, script: str, **_: object) -> str:
        job_id = str(uuid.uuid4().int % 10**9)  # unique in this database's pilots
        guess = datetime.now(UTC) + timedelta(hours=5)
        self.known[job_id] = BatchJob(job_id, "PENDING", "Resources", None, guess, None)
        return job_id

    async def jobs(self, job_ids: Sequence[str]) -> dict[str, BatchJob]:
        return {i: self.known[i] for i in job_ids if i in self.known}

    async def cancel(self, job_id: str, signal: str | None = None) -> None:
        self.cancelled.append(job_id)
        self.known[job_id] = BatchJob(job_id, "CANCELLED", None, None, None, None)

    def run(self, job_id: str) -> datetime:
        start = datetime.now(UTC).replace(microsecond=0)
        ends = start + timedelta(minutes=10)
        self.known[job_id] = BatchJob(job_id, "RUNNING", None, start, ends, 600.0)
        return ends


def _pilot_pool(pool: db.Pool, batch: _Batch, tmp: Path) -> PilotPool:
    """The pool's pilots on `batch`, in a worker pool of their own."""
    settings = PilotPoolSettings(
        backend="slurm",
        worker_pool=f"p-{uuid.uuid4().hex[:8]}",
        cpus=1,
        workdir=str(tmp / "pilots"),
    )
    return PilotPool(pool, batch, settings)


async def _pilots(conn: db.Connection, pool: str) -> Mapping[str, pilots_repo.Pilot]:
    return {p.id: p for p in await pilots_repo.listed(conn, pool)}


async def test_a_cancelled_jobs_demand_is_gone_and_the_pilots_it_caused_are_cancelled_pending(
    pool: db.Pool, tmp_path: Path
) -> None:
    batch = _Batch()
    pilots = _pilot_pool(pool, batch, tmp_path)
    async with pool.acquire() as conn:
        # given a large job waiting for hosts, for which three pilots are asked and submitted
        job = await _waiting(conn, cpus=1, gpus=0, tasks=3, reason="no_host")
        await pilots.run_once()
        await pilots.run_once()
        asked = await _pilots(conn, pilots.settings.worker_pool)
        assert sorted(p.state for p in asked.values()) == ["pending"] * 3
        # and an operator's pilot, pending too
        [own] = await pilots_repo.request(
            conn, pilots.settings.worker_pool, "slurm", pilots_repo.Ask(1, 600), 1, "op"
        )

        # when the job is cancelled
        await conn.execute("UPDATE jobs SET state = 'cancelled' WHERE id = $1", job.id)
        assert await pilots._wanted_cpus() == 0
        await pilots.run_once()  # the operator's is submitted; the others withdrawn
        await pilots.run_once()  # their batch jobs cancelled
        await pilots.run_once()  # and seen ended
        after = await _pilots(conn, pilots.settings.worker_pool)

    # then the pilots it caused are cancelled while pending, never started; the operator's stays
    assert set(batch.cancelled) == {p.batch_job_id for p in asked.values()}
    assert {after[i].state for i in asked} == {"ended"}
    assert {after[i].reason for i in asked} == {"no work waits for it"}
    assert after[own.id].state == "pending"


async def test_a_pilot_that_starts_and_takes_the_work_it_was_asked_for_is_never_withdrawn(
    pool: db.Pool, tmp_path: Path
) -> None:
    batch = _Batch()
    pilots = _pilot_pool(pool, batch, tmp_path)
    async with pool.acquire() as conn:
        # given a pilot asked for and submitted for a task waiting for a host
        job = await _waiting(conn, cpus=1, gpus=0, tasks=1, reason="no_host")
        await pilots.run_once()
        await pilots.run_once()
        [asked] = (await _pilots(conn, pilots.settings.worker_pool)).values()
        assert asked.state == "pending" and asked.batch_job_id is not None

        # when it starts and its host takes the task (nothing waits for a host any more)
        batch.run(asked.batch_job_id)
        await conn.execute("DELETE FROM job_waits WHERE job_id = $1", job.id)
        await pilots.run_once()
        after = await pilots_repo.get(conn, asked.id)

    # then it runs: a pilot seen starting in this look is not withdrawn as "not started"
    assert after is not None and after.state == "running"
    assert batch.cancelled == []


async def test_a_pending_pilot_has_no_host_and_no_end_until_it_runs(
    pool: db.Pool, tmp_path: Path
) -> None:
    batch = _Batch()
    pilots = _pilot_pool(pool, batch, tmp_path)
    async with pool.acquire() as conn:
        # given an operator's pilot submitted, pending (the batch system guesses its end)
        [pilot] = await pilots_repo.request(
            conn, pilots.settings.worker_pool, "slurm", pilots_repo.Ask(1, 600), 1, "op"
        )
        await pilots.run_once()
        await pilots.run_once()
        pending = await pilots_repo.get(conn, pilot.id)
        assert pending is not None and pending.batch_job_id is not None

        # when it starts
        ends = batch.run(pending.batch_job_id)
        await pilots.run_once()
        running = await pilots_repo.get(conn, pilot.id)

    # then only then does it show its host and its end
    assert (pending.state, pending.host_id, pending.ends_at) == ("pending", None, None)
    assert running is not None and running.state == "running"
    assert (running.host_id, running.ends_at) == (f"pilot-{pending.batch_job_id}", ends)


async def test_stopping_the_installation_cancels_its_pilots_on_the_real_slurm(
    pool: db.Pool, slurm_conf: str, tmp_path: Path
) -> None:
    slurm = Slurm(slurm_conf, timeout_s=20)
    async with pool.acquire() as conn:
        await conn.execute("DELETE FROM pilots")  # this database's pilots: this test's only
        # given a pilot running as a real batch job, and one not yet submitted
        batch_id = await submit(slurm, tmp_path, 300)
        await until(slurm, batch_id, lambda job: job is not None and job.state == "RUNNING")
        [running, requested] = await pilots_repo.request(
            conn, "default", "slurm", pilots_repo.Ask(1, 600), 2, "op"
        )
        await conn.execute(
            "UPDATE pilots SET state = 'running', batch_job_id = $2 WHERE id = $1",
            running.id,
            batch_id,
        )

        # when the installation is stopped (scripts/down)
        done = await stop_pilots.stop(conn, slurm)
        after = await _pilots(conn, "default")

    # then its batch job is cancelled at once, and both are withdrawn, saying why
    await until(slurm, batch_id, lambda job: job is None or job.state == "CANCELLED")
    assert sorted(one.line() for one in done) == sorted(
        [
            f"pilot {running.id} (batch job {batch_id}): cancelled",
            f"pilot {requested.id} (never submitted): cancelled",
        ]
    )
    assert (after[running.id].state, after[running.id].reason) == ("draining", stop_pilots.WHY)
    assert after[requested.id].state == "ended"


async def test_a_pilot_that_cannot_be_cancelled_is_named_with_how_long_it_lives(
    pool: db.Pool, tmp_path: Path
) -> None:
    async with pool.acquire() as conn:
        await conn.execute("DELETE FROM pilots")
        [pilot] = await pilots_repo.request(
            conn, "default", "slurm", pilots_repo.Ask(1, 600), 1, "op"
        )
        await conn.execute(
            "UPDATE pilots SET state = 'running', batch_job_id = '77',"
            " ends_at = '2030-01-01 12:00:00+00' WHERE id = $1",
            pilot.id,
        )

        [done] = await stop_pilots.stop(conn, Slurm(bin_dir=str(tmp_path)))  # no scancel there

    assert done.line().startswith(f"pilot {pilot.id} (batch job 77) not cancelled: ")
    assert "scancel not found" in done.line() and "it lives until 2030-01-01" in done.line()
