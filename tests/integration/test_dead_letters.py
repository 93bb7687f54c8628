"""Dead-lettered work messages (`services/scheduler/dead_letters.py`), against the real
PostgreSQL and RabbitMQ: recorded with their job, their task released again, then held or
failed rather than left claimed for ever with no message."""

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from services.scheduler import dead_letters
from shared.domain.messages import KillTask, RunStage, encode
from shared.domain.states import Stage, TaskState
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology, delete_all
from shared.store import jobs_repo, tasks_repo, users_repo
from shared.store.db import Pool
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL

pytestmark = pytest.mark.integration
S = TaskState


async def _claimed(pool: Pool, state: TaskState = S.NEW) -> tasks_repo.Task:
    """Given-step: a task resting in `state`, claimed (its message sent), taken by no worker."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(
            conn, f"u-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
        )
        job, _ = await jobs_repo.create(conn, user.id, NewJob("dl", "shell", "true", ["a"]))
        await conn.execute(
            "UPDATE tasks SET claim = gen_random_uuid(), state = $2, host = 'h-1'"
            " WHERE job_id = $1",
            job.id,
            state.value,
        )
        [task] = await tasks_repo.list_for_job(conn, job.id)
    return task


def _run_stage(task: tasks_repo.Task, stage: Stage = Stage.SETUP) -> RunStage:
    assert task.claim is not None
    return RunStage(job_id=task.job_id, task_id=task.id, stage=stage, claim=task.claim)


async def _errors(pool: Pool, task_id: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT brief FROM job_errors WHERE task_id = $1 AND severity = 'dead_letter' ORDER BY id",
        task_id,
    )
    return [r["brief"] for r in rows]


async def _reclaim(pool: Pool, task_id: str) -> tasks_repo.Task:
    """The scheduler released it again: a new claim, as the dispatcher would give."""
    await pool.execute("UPDATE tasks SET claim = gen_random_uuid() WHERE id = $1", task_id)
    async with pool.acquire() as conn:
        task = await tasks_repo.get(conn, task_id)
    assert task is not None
    return task


async def test_a_dead_setup_message_releases_its_task_twice_then_holds_it(pool: Pool) -> None:
    task = await _claimed(pool)

    for death in (1, 2):
        await dead_letters.handle(pool, _run_stage(task))
        async with pool.acquire() as conn:
            after = await tasks_repo.get(conn, task.id)
        assert after is not None and (after.state, after.claim) == (S.NEW, None), death
        task = await _reclaim(pool, task.id)

    await dead_letters.handle(pool, _run_stage(task))
    async with pool.acquire() as conn:
        held = await tasks_repo.get(conn, task.id)
    assert held is not None and held.state is S.ON_HOLD and held.claim is None
    assert held.error_brief is not None and "dead-lettered 3 times" in held.error_brief
    briefs = await _errors(pool, task.id)
    assert [b.rsplit("; ", 1)[-1] for b in briefs] == [
        "released again",
        "released again",
        "held (release it once the workers' logs say why)",
    ]


async def test_a_resting_task_whose_messages_keep_dying_fails_as_platform(pool: Pool) -> None:
    task = await _claimed(pool, S.QUEUED)
    for _ in range(dead_letters.MAX_DEAD_LETTERS - 1):
        await dead_letters.handle(pool, _run_stage(task, Stage.CLUSTER))
        task = await _reclaim(pool, task.id)

    await dead_letters.handle(pool, _run_stage(task, Stage.CLUSTER))

    async with pool.acquire() as conn:
        failed = await tasks_repo.get(conn, task.id)
    assert failed is not None and failed.state is S.FAILED_ON_CLUSTER
    assert failed.failure_class is not None and failed.failure_class.value == "platform"


async def test_a_stale_dead_letter_changes_nothing_but_is_recorded(pool: Pool) -> None:
    task = await _claimed(pool)
    await pool.execute("UPDATE tasks SET worker = 'w-1' WHERE id = $1", task.id)  # taken

    await dead_letters.handle(pool, _run_stage(task))
    assert task.claim is not None
    await dead_letters.handle(
        pool,
        KillTask(
            job_id=task.job_id,
            task_id=task.id,
            pid=1,
            create_time=0.0,
            claim=task.claim,
            reason="cancelled",
        ),
    )

    async with pool.acquire() as conn:
        after = await tasks_repo.get(conn, task.id)
    assert after is not None and after.claim == task.claim and after.state is S.NEW
    briefs = await _errors(pool, task.id)
    assert briefs[0].endswith("the task has moved on since (nothing to do)")
    assert briefs[1].startswith("its kill_task message was dead-lettered (2 time(s))")


@pytest.fixture
async def topology() -> AsyncIterator[Topology]:
    topology = Topology(f"t{uuid.uuid4().hex[:10]}")
    yield topology
    connection = await aio_pika.connect(AMQP_URL)
    try:
        await delete_all(await connection.channel(), topology, [])
    finally:
        await connection.close()


async def test_the_scheduler_reads_what_the_broker_dead_letters(
    pool: Pool, topology: Topology
) -> None:
    task = await _claimed(pool)
    async with open_broker(AMQP_URL, topology, "test-dead-letters") as broker:
        await dead_letters.start(broker, pool)
        dlx = await broker.channel.get_exchange(topology.dead_letter_exchange)

        await dlx.publish(aio_pika.Message(encode(_run_stage(task))), routing_key="")

        async with asyncio.timeout(10):
            while not await _errors(pool, task.id):  # noqa: ASYNC110  (no event to wait on)
                await asyncio.sleep(0.05)
    async with pool.acquire() as conn:
        after = await tasks_repo.get(conn, task.id)
    assert after is not None and after.claim is None
