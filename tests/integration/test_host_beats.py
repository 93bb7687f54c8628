"""What a host's beats read: the supervisor's beat says, in its one statement,
whether its worker is silent and whether its reconcile has anything to look at; the worker's
says how many tasks its instance holds, and a worker holding none reads nothing at its
reconcile. The real PostgreSQL; the rows as the services leave them."""

import asyncio
import uuid
from typing import cast

import pytest

from services.supervisor.heartbeat import LastBeat, heartbeat
from services.worker.consumer import Consumer
from services.worker.stages import StageRunner
from shared.host.fence import Lease
from shared.store import db, hosts_repo, jobs_repo, tasks_repo, users_repo
from shared.store.hosts_repo import SupervisorBeat
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


async def _host(pool: db.Pool) -> str:
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    await pool.execute(
        "INSERT INTO hosts (id, slots, worker, heartbeat_at) VALUES ($1, 1, $1 || '-w', now())",
        host_id,
    )
    return host_id


async def _task(pool: db.Pool) -> str:
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("b", "shell", "true", ["a"]))
        [task] = await tasks_repo.list_for_job(conn, job.id)
    return task.id


async def _beat(pool: db.Pool, host_id: str, dead_worker_s: float = 10.0) -> SupervisorBeat:
    async with pool.acquire() as conn:
        return await hosts_repo.beat_supervisor(conn, host_id, f"{host_id}-s", dead_worker_s)


async def test_an_idle_hosts_supervisor_beat_finds_nothing_to_look_at(pool: db.Pool) -> None:
    host_id = await _host(pool)
    beat = await _beat(pool, host_id)
    assert beat == SupervisorBeat(f"{host_id}-w", False, False, False, False)


async def test_the_supervisor_beat_makes_the_row_of_a_host_no_worker_registered(
    pool: db.Pool,
) -> None:
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    assert await _beat(pool, host_id) == SupervisorBeat(None, False, False, False, False)
    row = await pool.fetchrow("SELECT supervisor FROM hosts WHERE id = $1", host_id)
    assert row is not None and row["supervisor"] == f"{host_id}-s"


async def test_a_silent_worker_is_seen_by_the_supervisor_beat(pool: db.Pool) -> None:
    host_id = await _host(pool)
    await pool.execute(
        "UPDATE hosts SET heartbeat_at = now() - interval '11 seconds' WHERE id = $1", host_id
    )
    assert (await _beat(pool, host_id, dead_worker_s=10)).worker_silent
    assert not (await _beat(pool, host_id, dead_worker_s=12)).worker_silent


async def test_a_running_command_a_stale_holder_and_an_owed_kill_are_each_seen(
    pool: db.Pool,
) -> None:
    host_id = await _host(pool)
    running, stale, killed = await _task(pool), await _task(pool), await _task(pool)
    await pool.execute(
        "UPDATE tasks SET state = 'on_cpu', claim = gen_random_uuid(), host = $2,"
        " worker = $2 || '-w', pid = 10, attempt = 1 WHERE id = $1",
        running,
        host_id,
    )
    assert (await _beat(pool, host_id)) == SupervisorBeat(f"{host_id}-w", False, True, False, False)
    await pool.execute(  # held by an instance that is not the registered worker
        "UPDATE tasks SET state = 'setting_up', claim = gen_random_uuid(), host = $2,"
        " worker = $2 || '-gone' WHERE id = $1",
        stale,
        host_id,
    )
    assert (await _beat(pool, host_id)).stale_holders
    await pool.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, host, claim, pid,"
        " ended_at, failure_class) VALUES ($1, 1, 1, 'cluster', $2, gen_random_uuid(), 11,"
        " now(), 'cancelled')",
        killed,
        host_id,
    )
    beat = await _beat(pool, host_id)
    assert beat.running and beat.stale_holders and beat.kills_owed
    await pool.execute("UPDATE attempts SET reaped_at = now() WHERE task_id = $1", killed)
    assert not (await _beat(pool, host_id)).kills_owed


async def test_a_failed_beat_makes_the_rounds_look_at_everything(
    session_database_url: str,
) -> None:
    last = LastBeat(SupervisorBeat(None, False, False, False, False))
    async with db.open_pool(session_database_url) as closed:
        pass  # closed: every acquire fails, as with the database away
    stop = asyncio.Event()
    stop.set()  # one beat
    await heartbeat(closed, "h-away", "h-away-s", 0.01, stop, Lease(), 10.0, last)
    assert last.beat == SupervisorBeat.unknown()


async def test_the_worker_beat_counts_what_its_instance_holds(pool: db.Pool) -> None:
    host_id = await _host(pool)
    async with pool.acquire() as conn:
        row = await hosts_repo.beat_worker(conn, host_id, f"{host_id}-w")
    assert row is not None and row["held"] == 0
    task_id = await _task(pool)
    await pool.execute(
        "UPDATE tasks SET state = 'setting_up', claim = gen_random_uuid(), host = $2,"
        " worker = $2 || '-w' WHERE id = $1",
        task_id,
        host_id,
    )
    async with pool.acquire() as conn:
        row = await hosts_repo.beat_worker(conn, host_id, f"{host_id}-w")
    assert row is not None and row["held"] == 1
    # ended, its claim kept for triage: not held (as `tasks_repo.held_by` says)
    await pool.execute("UPDATE tasks SET state = 'failed_on_cluster' WHERE id = $1", task_id)
    async with pool.acquire() as conn:
        row = await hosts_repo.beat_worker(conn, host_id, f"{host_id}-w")
    assert row is not None and row["held"] == 0


class _Unread:
    """A runner whose database must not be read: any use of it fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the reconcile read {name}")


async def test_a_worker_holding_nothing_reads_nothing_at_its_reconcile() -> None:
    consumer = Consumer(cast(StageRunner, _Unread()), 1)
    consumer.note_held(0)
    assert await consumer.reconcile() == 0
    consumer.note_held(1)  # held: it reads
    with pytest.raises(AssertionError, match="the reconcile read"):
        await consumer.reconcile()
