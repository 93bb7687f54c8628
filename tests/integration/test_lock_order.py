"""One lock order: bulk actions, the triage, the finaliser and a job's cancel racing on
the 5,000 tasks of one job finish without a deadlock error reaching anyone.

Every writer locks job rows before task rows, several of a kind in id order
(`docs/explanation/architecture.md`, "Lock order"); the triage and the finaliser skip what is
locked.
"""

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from services.scheduler.finaliser import Finaliser
from services.scheduler.triage import Triage, TriageSettings
from shared.domain.actions import JobAction, TaskAction
from shared.domain.analyser import DefaultAnalyser
from shared.domain.selectors import TaskSelector
from shared.domain.states import TERMINAL, JobState, TaskState
from shared.messaging.redis_keys import RedisKeys
from shared.operations import bulk, task_actions
from shared.operations.bulk import BulkRequest, Limits
from shared.store import jobs_repo, users_repo
from shared.store.db import Pool, open_pool
from shared.store.jobs_repo import NewJob
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.integration

TASKS = 5000


async def _big_job(pool: Pool, name: str) -> tuple[str, users_repo.User]:
    """A job of 5,000 tasks: failed ones the triage has not decided about, completed ones
    and new ones."""
    async with pool.acquire() as conn:
        operator = await users_repo.ensure_user(conn, f"op-{name}", "operator", uuid.uuid4().hex)
        new = NewJob(name, "shell", "true", [str(i) for i in range(TASKS)])
        job, _ = await jobs_repo.create(conn, operator.id, new)
        await conn.execute(
            "UPDATE tasks SET state = CASE index % 5"
            "   WHEN 0 THEN 'failed_on_cluster' WHEN 1 THEN 'failed_on_cluster'"
            "   WHEN 2 THEN 'completed' WHEN 3 THEN 'completed' ELSE 'new' END::task_state,"
            " failure_class = CASE WHEN index % 5 < 2 THEN 'exit'::failure_class END,"
            " exit_code = CASE WHEN index % 5 < 2 THEN 1 END,"
            " decided = index % 5 >= 2, host = 'h-1'"
            " WHERE job_id = $1",
            job.id,
        )
    return job.id, operator


async def test_bulk_actions_triage_finaliser_and_cancel_racing_on_one_job_never_deadlock(
    session_database_url: str, namespace: str
) -> None:
    name = f"locks-{uuid.uuid4().hex[:8]}"
    async with open_pool(session_database_url, max_size=8) as pool:
        job_id, operator = await _big_job(pool, name)
        selector = TaskSelector(job_name=name)
        limits = Limits(max_tasks=TASKS, confirm_over=TASKS, batch=200)
        settings = TriageSettings(
            batch=500,
            fence_timeout_s=60,
            quarantine_after=0,
            quarantine_window_s=600,
            quarantine_s=600,
        )
        triage = Triage(pool, {"default": DefaultAnalyser(rand=lambda: 1.0)}, settings)
        redis = Redis.from_url(REDIS_URL, decode_responses=True)
        finaliser = Finaliser(pool, redis, RedisKeys(namespace), batch=1000)

        async def in_bulk(action: TaskAction) -> bulk.Outcome:
            async with pool.acquire() as conn:
                request = BulkRequest(selector, action, confirm=True)
                return await bulk.run(conn, request, operator, limits)

        async def triaging() -> None:
            for _ in range(20):
                if not await triage.run_once():
                    return

        async def finalising() -> None:
            for _ in range(20):
                await finaliser.run_once()

        async def cancelling() -> None:
            async with pool.acquire() as conn:
                await task_actions.apply_to_job(conn, job_id, JobAction.CANCEL, "ops")

        try:
            async with asyncio.timeout(120):
                results = await asyncio.gather(
                    in_bulk(TaskAction.RECOVER),
                    in_bulk(TaskAction.RESTART_CLUSTER),
                    in_bulk(TaskAction.HOLD),
                    triaging(),
                    finalising(),
                    cancelling(),
                    in_bulk(TaskAction.CANCEL),
                    return_exceptions=True,
                )
        finally:
            await redis.aclose()
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        for outcome in results[:3] + results[6:]:
            assert isinstance(outcome, bulk.Outcome)
            assert bulk.RACED not in outcome.record.refusals, outcome.record.refusals
        async with pool.acquire() as conn:
            job = await jobs_repo.get(conn, job_id)
            states = await conn.fetch(
                "SELECT state::text AS state, count(*) FROM tasks WHERE job_id = $1 GROUP BY 1",
                job_id,
            )
        assert job is not None and job.state is JobState.CANCELLED
        assert {TaskState(r["state"]) for r in states} <= TERMINAL, states


async def test_a_cancel_that_loses_a_deadlock_is_tried_again_and_cancels_the_job(
    session_database_url: str,
) -> None:
    # given: a running job whose task a concurrent writer holds (as a planning round's claim
    # does, in its own order); that writer waits for the job's row only after the cancel
    # holds it and waits for the task, and lets PostgreSQL pick the cancel as the victim
    name = f"deadlock-{uuid.uuid4().hex[:8]}"
    async with open_pool(session_database_url, max_size=4) as pool:
        async with pool.acquire() as conn:
            operator = await users_repo.ensure_user(conn, f"op-{name}", "operator", "x")
            job, _ = await jobs_repo.create(conn, operator.id, NewJob(name, "shell", "true", ["a"]))
            [task_id] = [
                r["id"] for r in await conn.fetch("SELECT id FROM tasks WHERE job_id = $1", job.id)
            ]
        async with pool.acquire() as writer, pool.acquire() as cancelling:
            cancel_pid = cancelling.get_server_pid()
            held = writer.transaction()
            await held.start()
            await writer.execute("SET LOCAL deadlock_timeout = '60s'")
            await writer.execute("UPDATE tasks SET updated_at = now() WHERE id = $1", task_id)

            # when: the operator cancels the job meanwhile
            cancel = asyncio.create_task(
                task_actions.apply_to_job(cancelling, job.id, JobAction.CANCEL, "operator")
            )
            async with asyncio.timeout(30):
                while not await writer.fetchval(  # noqa: ASYNC110
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                    cancel_pid,
                ):
                    await asyncio.sleep(0.05)  # no event says that a backend waits on a lock
            await writer.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", job.id)
            await held.commit()

            # then: PostgreSQL aborted the cancel's first try, and the next one cancelled it
            async with asyncio.timeout(30):
                cancelled = await cancel
    assert cancelled.state is JobState.CANCELLED
