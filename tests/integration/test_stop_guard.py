"""Writers that can make a job active take the emergency stop's lock before any row lock
(`shared.operations.stop_guard`): a stop holding it waits on job and task rows, so a writer that
held a row while waiting for the lock would deadlock with it."""

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg
import pytest

from shared.domain.actions import JobAction, TaskAction
from shared.operations import datasets, stop_guard, task_actions
from shared.store import jobs_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.integration.waiting import until_blocked

pytestmark = pytest.mark.integration

Writer = Callable[[Connection, str, str], Coroutine[Any, Any, object]]


async def _recover_task(conn: Connection, job_id: str, task_id: str) -> object:
    return await task_actions.apply_to_task(conn, task_id, TaskAction.RECOVER, "op")


async def _recover_job(conn: Connection, job_id: str, task_id: str) -> object:
    return await task_actions.apply_to_job(conn, job_id, JobAction.RECOVER_FAILED, "op")


async def _append(conn: Connection, job_id: str, task_id: str) -> object:
    return await datasets.add_inputs(conn, job_id, ["more"])


@pytest.mark.parametrize("writer", [_recover_task, _recover_job, _append])
async def test_a_writer_waiting_for_a_stop_holds_no_row(pool: Pool, writer: Writer) -> None:
    async with pool.acquire() as conn:
        # given a failed job
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("g", "shell", "true", ["a"]))
        [task_id] = await datasets.task_ids_of(conn, job.id)
        await conn.execute("UPDATE tasks SET state = 'failed_to_setup' WHERE id = $1", task_id)
        await conn.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", job.id)
    async with pool.acquire() as stop, pool.acquire() as writing:
        # when a stop holds its lock and the writer starts
        transaction = stop.transaction()
        await transaction.start()
        await stop.execute("SELECT pg_advisory_xact_lock($1)", stop_guard.LOCK_KEY)
        pending = asyncio.create_task(writer(writing, job.id, task_id))
        await until_blocked(pool, writing.get_server_pid())

        # then the stop can still lock the writer's rows (it would have to)
        try:
            await stop.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE NOWAIT", job.id)
            await stop.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE NOWAIT", task_id)
        except asyncpg.LockNotAvailableError:  # pragma: no cover - the failure being tested
            pytest.fail("the writer took a row lock before the stop's lock")
        finally:
            await transaction.rollback()
            await pending
