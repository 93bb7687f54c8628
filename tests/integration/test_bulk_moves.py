"""A bulk action's set-based moves (`bulk._move_together`, `tasks_repo.move_tasks`) do what the
one-task path does: the same states, failure fields, decided flag, events and reopened jobs,
with refusals counted."""

import json
import uuid
from typing import Any

import pytest

from shared.domain.actions import TaskAction
from shared.domain.messages import TaskEvent, to_jsonable
from shared.domain.selectors import TaskSelector
from shared.domain.states import TaskState
from shared.operations import bulk, task_actions
from shared.operations.bulk import BulkRequest, Limits
from shared.store import jobs_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


async def _job(conn: Connection, owner: users_repo.User, name: str, *states: str) -> list[str]:
    job, _ = await jobs_repo.create(
        conn, owner.id, NewJob(name, "shell", "true", [str(i) for i in range(len(states))])
    )
    ids = [
        r["id"]
        for r in await conn.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job.id)
    ]
    for task_id, state in zip(ids, states, strict=True):
        await conn.execute(
            "UPDATE tasks SET state = $2, failure_class = 'exit', exit_code = 3, host = 'h-1',"
            " error_brief = 'boom', decided = true WHERE id = $1",
            task_id,
            state,
        )
    return ids


async def _task(conn: Connection, task_id: str) -> Any:
    return await conn.fetchrow(
        "SELECT state::text AS state, failure_class::text AS failure_class, exit_code,"
        " error_brief, decided, claim FROM tasks WHERE id = $1",
        task_id,
    )


async def _events(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT body::text AS body FROM outbox WHERE body->>'task_id' = $1 ORDER BY id", task_id
    )
    return [json.loads(r["body"]) for r in rows]


async def test_a_bulk_recover_moves_a_batch_together_like_the_one_task_path(pool: Pool) -> None:
    name = f"moves-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        # given: failures of several kinds in two jobs, one of them ended failed
        operator = await users_repo.ensure_user(conn, f"op-{name}", "operator", uuid.uuid4().hex)
        on_cluster, prereq, done = await _job(
            conn,
            operator,
            f"{name}-a",
            "failed_on_cluster",
            "failed_setup_prerequisites",
            "completed",
        )
        [other] = await _job(conn, operator, f"{name}-b", "failed_to_setup")
        await conn.execute(
            "UPDATE jobs SET state = 'failed', finished_at = now() WHERE name = $1", f"{name}-b"
        )
        request = BulkRequest(TaskSelector(job_name=f"{name}-*"), TaskAction.RECOVER, confirm=True)
        # when: in batches of three
        outcome = await bulk.run(conn, request, operator, Limits(batch=3))
        # then
        assert (outcome.record.applied, outcome.record.refusals) == (
            3,
            {"not allowed in state completed": 1},
        )
        # a move to a hook state keeps the failure for the hook; a plain one clears it
        assert dict(await _task(conn, on_cluster)) == {
            "state": "recover_cluster",
            "failure_class": "exit",
            "exit_code": 3,
            "error_brief": "boom",
            "decided": True,
            "claim": None,
        }
        assert dict(await _task(conn, prereq)) == {
            "state": "new",
            "failure_class": None,
            "exit_code": None,
            "error_brief": None,
            "decided": True,
            "claim": None,
        }
        assert (await _task(conn, done))["state"] == "completed"
        assert (await _task(conn, other))["state"] == "recover_setup"
        # the ended job has work again
        assert await conn.fetchval("SELECT state FROM jobs WHERE name = $1", f"{name}-b") == (
            "active"
        )
        # each moved task has its event, shaped as the model writes it
        [event] = [e for e in await _events(conn, prereq) if e["previous"] is not None]
        assert set(event) == set(
            to_jsonable(TaskEvent(job_id="j", task_id="t", state=TaskState.NEW))
        )
        assert (event["previous"], event["failure_class"]) == ("failed_setup_prerequisites", None)
        [recovered] = [
            e for e in await _events(conn, on_cluster) if e["state"] == "recover_cluster"
        ]
        assert (recovered["previous"], recovered["exit_code"]) == ("failed_on_cluster", 3)


async def test_a_restart_in_bulk_reopens_a_completed_job(pool: Pool) -> None:
    name = f"moves-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        operator = await users_repo.ensure_user(conn, f"op-{name}", "operator", uuid.uuid4().hex)
        ids = await _job(conn, operator, name, "completed", "completed")
        await conn.execute(
            "UPDATE jobs SET state = 'completed', finished_at = now() WHERE name = $1", name
        )
        request = BulkRequest(TaskSelector(job_name=name), TaskAction.RESTART_CLUSTER, confirm=True)

        outcome = await bulk.run(conn, request, operator, Limits(batch=10))

        assert outcome.record.applied == 2
        assert [(await _task(conn, t))["state"] for t in ids] == ["restart_cluster"] * 2
        assert await conn.fetchval("SELECT state FROM jobs WHERE name = $1", name) == "active"
        # and the one-task path agrees on what it would do now: nothing more
        with pytest.raises(Exception, match="restart_cluster"):
            await task_actions.apply_to_task(conn, ids[0], TaskAction.RESTART_CLUSTER, "ops")


async def test_a_bulk_cancel_terminates_a_batch_together_and_orders_the_running_killed(
    pool: Pool,
) -> None:
    name = f"moves-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        # given: a task on a CPU (its process known, an attempt open), one waiting, one done
        operator = await users_repo.ensure_user(conn, f"op-{name}", "operator", uuid.uuid4().hex)
        running, waiting, done = await _job(conn, operator, name, "on_cpu", "new", "completed")
        await conn.execute(
            "UPDATE tasks SET pid = 4242, pid_create_time = 17.5, failure_class = NULL"
            " WHERE id = $1",
            running,
        )
        await conn.execute(
            "INSERT INTO attempts (task_id, attempt, stage, run_number, host, started_at)"
            " VALUES ($1, 1, 'cluster', 1, 'h-1', now())",
            running,
        )
        request = BulkRequest(TaskSelector(job_name=name), TaskAction.CANCEL, confirm=True)
        # when
        outcome = await bulk.run(conn, request, operator, Limits(batch=10))
        # then
        assert (outcome.record.applied, outcome.record.refusals) == (
            2,
            {"not allowed in state completed": 1},
        )
        for task_id in (running, waiting):
            row = await _task(conn, task_id)
            assert (row["state"], row["failure_class"], row["error_brief"]) == (
                "terminated",
                "cancelled",
                f"cancelled by {operator.name}",
            )
        assert (await _task(conn, done))["state"] == "completed"
        attempt = await conn.fetchrow(
            "SELECT outcome, ended_at FROM attempts WHERE task_id = $1", running
        )
        assert attempt is not None and attempt["outcome"] == "terminated"
        assert attempt["ended_at"] is not None
        kills = await conn.fetch(
            "SELECT routing_key, body::text AS body FROM outbox WHERE body->>'type' = 'kill_task'"
            " AND body->>'task_id' = ANY($1::text[])",
            [running, waiting],
        )
        assert [(k["routing_key"], json.loads(k["body"])["pid"]) for k in kills] == [
            ("supervise.h-1", 4242)
        ]
        [event] = [e for e in await _events(conn, running) if e.get("state") == "terminated"]
        assert (event["previous"], event["failure_class"]) == ("on_cpu", "cancelled")
