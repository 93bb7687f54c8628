"""Stray processes: a command held at its gate while its task is still being set up is the
task's own; one whose task moved on is killed (real processes, real PostgreSQL)."""

import asyncio
import uuid
from pathlib import Path

import pytest

from services.supervisor.strays import kill_strays
from services.worker import process
from shared.host import marks
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration


async def _task_in(conn: db.Connection, state: str, claim: uuid.UUID) -> str:
    user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
    job, _ = await jobs_repo.create(conn, user.id, NewJob("s", "shell", "true", ["a"]))
    return str(
        await conn.fetchval(
            "UPDATE tasks SET state = $2, claim = $3 WHERE job_id = $1 RETURNING id",
            job.id,
            state,
            claim,
        )
    )


async def _visible(namespace: str, count: int, within: float = 5.0) -> None:
    """Until `count` marked processes of `namespace` show in /proc. The parent of a vforked
    child is woken, and its exec's error pipe closed, once the child's exec has replaced its
    memory but before it has laid out its arguments and environment: for that moment the new
    process's `environ` reads empty (seen: 1 run in 5 failed without this wait)."""
    async with asyncio.timeout(within):
        while len(marks.marked_processes(namespace, "h")) < count:  # noqa: ASYNC110 (/proc)
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("state", ["setting_up", "new"])  # new: a folded take's
async def test_a_gated_command_of_a_task_being_set_up_is_kept_and_one_of_an_ended_task_killed(
    pool: db.Pool, namespace: str, tmp_path: Path, state: str
) -> None:
    claim = uuid.uuid4()
    async with pool.acquire() as conn:
        starting = await _task_in(conn, state, claim)
        ended = await _task_in(conn, "terminated", claim)
    held = {
        task_id: await process.spawn(
            "true", tmp_path, {marks.VARIABLE: marks.mark(namespace, "h", task_id, claim)}
        )
        for task_id in (starting, ended)
    }
    try:
        await _visible(namespace, len(held))
        killed = await kill_strays(pool, namespace, "h", None)

        assert [m.task_id for m in killed] == [ended]
        assert await held[ended].process.wait() == -9
        assert held[starting].process.returncode is None
    finally:
        for running in held.values():
            running.close_gate()
            await running.process.wait()
