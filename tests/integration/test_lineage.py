"""Resubmission: the clone takes the failed task's place, and prerequisites follow it."""

import uuid
from typing import Any

import pytest

from shared.domain.errors import Conflict
from shared.domain.states import TaskState
from shared.operations import datasets, lineage
from shared.store import jobs_repo, tasks_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


async def _job(conn: Connection, inputs: list[Any], **fields: Any) -> tuple[str, list[str]]:
    user = await users_repo.ensure_user(
        conn, f"u-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    job, _ = await jobs_repo.create(conn, user.id, NewJob("l", "shell", "true", inputs, **fields))
    return job.id, await datasets.task_ids_of(conn, job.id)


async def _fail(conn: Connection, task_id: str) -> None:
    await conn.execute("UPDATE tasks SET state = 'failed_on_cluster' WHERE id = $1", task_id)


async def test_when_a_failed_task_is_resubmitted__waiting_tasks_follow_the_clone(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given t2 waits before setup for t1 to complete, and t1 has failed
        _j1, [t1] = await _job(conn, ["x"])
        j2, [t2] = await _job(conn, ["y"], prerequisites={"setup": {t1: "completed"}})
        await datasets.apply_job_prerequisites(conn, j2, [t2])
        await _fail(conn, t1)

        # when t1 is resubmitted
        clone = await lineage.resubmit(conn, t1)

        # then the clone starts over and t2 now waits for it
        original = await tasks_repo.get(conn, t1)
        assert original is not None
        assert (original.state, original.superseded_by) == (TaskState.FAILED_ON_CLUSTER, clone.id)
        assert (clone.state, clone.resubmitted_from, clone.input) == (TaskState.NEW, t1, "x")
        assert clone.infra_retries == 1
        rows = await conn.fetch("SELECT on_task_id FROM task_prerequisites WHERE task_id = $1", t2)
        assert [r["on_task_id"] for r in rows] == [clone.id]


async def test_when_a_task_is_resubmitted__the_clone_waits_on_what_the_original_waited_on(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        _j0, [t0] = await _job(conn, ["a"])
        j1, [t1] = await _job(conn, ["b"], prerequisites={"setup": {t0: "queued"}})
        await datasets.apply_job_prerequisites(conn, j1, [t1])
        await _fail(conn, t1)

        clone = await lineage.resubmit(conn, t1)

        rows = await conn.fetch(
            "SELECT stage, on_task_id, required FROM task_prerequisites WHERE task_id = $1",
            clone.id,
        )
        assert [tuple(r) for r in rows] == [("setup", t0, "queued")]


async def test_when_the_clone_completes__the_superseded_failure_does_not_fail_the_job(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id, [t1] = await _job(conn, ["x"])
        await _fail(conn, t1)
        clone = await lineage.resubmit(conn, t1)
        await conn.execute("UPDATE tasks SET state = 'completed' WHERE id = $1", clone.id)

        found = dict(await jobs_repo.finished_candidates(conn, 10_000))

        assert found[job_id] == {"completed": 1}


@pytest.mark.parametrize("state", ["new", "completed"])
async def test_when_a_task_is_not_failed__it_cannot_be_resubmitted(pool: Pool, state: str) -> None:
    async with pool.acquire() as conn:
        _job_id, [t1] = await _job(conn, ["x"])
        await conn.execute("UPDATE tasks SET state = $2 WHERE id = $1", t1, state)
        with pytest.raises(Conflict, match="cannot be resubmitted"):
            await lineage.resubmit(conn, t1)


async def test_when_a_task_was_resubmitted_already__it_cannot_be_again(pool: Pool) -> None:
    async with pool.acquire() as conn:
        _job_id, [t1] = await _job(conn, ["x"])
        await _fail(conn, t1)
        await lineage.resubmit(conn, t1)
        with pytest.raises(Conflict, match="cannot be resubmitted"):
            await lineage.resubmit(conn, t1)
