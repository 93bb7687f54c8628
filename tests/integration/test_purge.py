"""Purging jobs and removing work dirs on the real database, through `shared/` alone: what a
purge deletes and records, when it is refused (and then writes nothing), what a purged job
refuses afterwards, and which jobs the retention finds due."""

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from services.scheduler.retention import Retention
from shared.domain.actions import JobAction, TaskAction
from shared.domain.errors import Conflict, NotFound
from shared.objects import ObjectStore, keys, open_store
from shared.operations import datasets, harvest, task_actions
from shared.store import jobs_repo, tasks_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.integration import harvest_steps as given
from tests.integration.harvest_steps import HOST
from tests.integration.waiting import until_blocked

pytestmark = pytest.mark.integration


async def _job(conn: Connection, inputs: int = 2, **fields: Any) -> str:
    user = await users_repo.ensure_user(
        conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    job, _ = await jobs_repo.create(
        conn, user.id, NewJob("demo", "shell", "true", [f"in-{i}" for i in range(inputs)], **fields)
    )
    return job.id


async def _ended_with_data(
    conn: Connection,
    job_state: str = "completed",
    *,
    ago_s: float = 0.0,
    store: ObjectStore | None = None,
    **task: Any,
) -> str:
    """Given-step: an ended job of two tasks, each with log lines and a kept output (in
    `store` too, when given)."""
    job_id = await _job(conn)
    for task_id in await given.end(conn, job_id, job_state, ago_s=ago_s, **task):
        await given.log_lines(conn, job_id, task_id)
        await given.record(conn, task_id, "out.txt", b"result", store=store)
    return job_id


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    """A directory store of the test's own."""
    return open_store((tmp_path / "store").as_uri())


async def _objects(store: ObjectStore, job_id: str) -> int:
    return len(await store.list_prefix(keys.job_outputs(job_id)))


async def _purged(conn: Connection, job_id: str) -> Any:
    return await conn.fetchrow(
        "SELECT purged_at, purged_by, purge_reason FROM jobs WHERE id = $1", job_id
    )


async def test_when_work_dirs_are_removed__one_message_per_host_and_job_names_them(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _job(conn, inputs=3)
        first, second, never_ran = await given.task_ids(conn, job_id)
        await given.put(conn, first, host="h-a", workdir="/w/a1")
        await given.put(conn, second, host="h-b", workdir="/w/b1")
        tasks = [await tasks_repo.get(conn, t) for t in (first, second, never_ran)]

        async with conn.transaction():
            queued = await harvest.remove_workdirs(conn, [t for t in tasks if t], "test")

        sent = [(k, b) for k, b in await given.outbox_of(conn, job_id) if k.startswith("host.")]
    assert queued == 2
    assert [(k, b["type"], b["task_ids"], b["workdirs"]) for k, b in sent] == [
        ("host.h-a", "remove_workdirs", [first], ["/w/a1"]),
        ("host.h-b", "remove_workdirs", [second], ["/w/b1"]),
    ]


async def test_when_an_ended_job_is_purged__logs_and_kept_bytes_go_and_the_purge_is_recorded(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)
        ids = await given.task_ids(conn, job_id)

        purged = await harvest.purge_job(conn, job_id, "ops", "disk space")

        assert (purged.logs, purged.contents, purged.removals) == (6, 2, 1)
        assert await given.logs_of(conn, job_id) == 0
        assert await given.kept_bytes(conn, job_id) == 0
        outputs = await conn.fetchval(
            "SELECT count(*) FROM task_outputs WHERE task_id = ANY($1::text[])", ids
        )
        assert outputs == 2  # the records stay: what was made, where, its checksum
        row = await _purged(conn, job_id)
        assert row["purged_at"] is not None
        assert (row["purged_by"], row["purge_reason"]) == ("ops", "disk space")
        sent = await given.outbox_of(conn, job_id)
    removal = [b for k, b in sent if k == f"host.{HOST}"]
    assert [(b["task_ids"], b["workdirs"]) for b in removal] == [
        (ids, [f"/w/{job_id}/{t}" for t in ids])
    ]
    [event] = [b for k, b in sent if k == f"job.purged.{job_id}"]
    assert event["brief"] == "purged by ops: disk space"


@pytest.mark.parametrize("state", ["failed", "cancelled"])
async def test_when_a_failed_or_cancelled_job_is_purged__it_is_purged(
    pool: Pool, state: str
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn, state, state="terminated")

        await harvest.purge_job(conn, job_id, "ops", "done")

        assert (await _purged(conn, job_id))["purged_by"] == "ops"


async def _refused(conn: Connection, job_id: str) -> str:
    """Purge, expecting a refusal that wrote nothing; returns its message."""
    with pytest.raises(Conflict) as refused:
        await harvest.purge_job(conn, job_id, "ops", "try")
    assert (await _purged(conn, job_id))["purged_at"] is None
    assert await given.logs_of(conn, job_id) == 6
    assert await given.kept_bytes(conn, job_id) == 2
    assert not [k for k, _ in await given.outbox_of(conn, job_id) if k.startswith("job.purged")]
    return str(refused.value)


async def test_when_the_job_has_not_ended__the_purge_is_refused_naming_its_state(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)
        await conn.execute("UPDATE jobs SET state = 'active' WHERE id = $1", job_id)

        message = await _refused(conn, job_id)

    assert "in state active" in message


@pytest.mark.parametrize(
    ("columns", "shown"),
    [
        ({"state": "on_cpu"}, "on_cpu"),
        ({"claim": uuid.uuid4()}, "completed"),
        ({"state": "failed_on_cluster", "decided": False}, "failed_on_cluster"),
    ],
    ids=["running", "claimed", "awaiting-triage"],
)
async def test_when_a_task_is_busy__the_purge_is_refused_naming_it(
    pool: Pool, columns: dict[str, Any], shown: str
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)
        busy = (await given.task_ids(conn, job_id))[1]
        await given.put(conn, busy, **columns)

        message = await _refused(conn, job_id)

    assert f"{busy} ({shown})" in message


async def test_when_a_job_chained_from_it_runs__the_purge_is_refused_naming_it(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)
        downstream = await _job(conn, inputs=1, inputs_from=job_id)

        message = await _refused(conn, job_id)

    assert downstream in message


async def test_when_the_job_was_purged__a_second_purge_is_refused(pool: Pool) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)
        await harvest.purge_job(conn, job_id, "ops", "first")

        with pytest.raises(Conflict, match=rf"job {job_id} was purged at .* by ops already"):
            await harvest.purge_job(conn, job_id, "ops", "second")

        assert (await _purged(conn, job_id))["purge_reason"] == "first"


async def test_when_the_job_does_not_exist__the_purge_raises_not_found(pool: Pool) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(NotFound):
            await harvest.purge_job(conn, "j-nosuchjob", "ops", "none")


async def test_when_a_job_is_purged__it_refuses_inputs_task_actions_and_job_actions(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn, "failed", state="failed_on_cluster")
        task_id = (await given.task_ids(conn, job_id))[0]
        await harvest.purge_job(conn, job_id, "ops", "gone")
        purged = rf"job {job_id} was purged at .* by ops: cannot"

        with pytest.raises(Conflict, match=purged + " append inputs"):
            await datasets.add_inputs(conn, job_id, ["more"])
        for action in (TaskAction.RECOVER, TaskAction.DUPLICATE):
            with pytest.raises(Conflict, match=purged + f" {action.value} a task"):
                await task_actions.apply_to_task(conn, task_id, action, "ops")
        with pytest.raises(Conflict, match=purged + " recover_failed"):
            await task_actions.apply_to_job(conn, job_id, JobAction.RECOVER_FAILED, "ops")

        job = await jobs_repo.get(conn, job_id)
    assert job is not None and job.state.value == "failed"
    assert job.counts == {"failed_on_cluster": 2}


async def test_when_the_purge_is_a_job_action__the_job_shows_it(pool: Pool) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)

        job = await task_actions.apply_to_job(conn, job_id, JobAction.PURGE, "ops")

    assert job.purged_at is not None and job.purged_by == "ops"
    assert job.purge_reason == "purge action"


async def test_when_retention_runs_out__only_ended_idle_unpurged_jobs_past_it_are_due(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        due = await _ended_with_data(conn, ago_s=120)
        not_yet = await _ended_with_data(conn, ago_s=30)
        forever = await _ended_with_data(conn, ago_s=10_000)
        busy = await _ended_with_data(conn, ago_s=120, state="on_cpu")
        purged = await _ended_with_data(conn, ago_s=120)
        for job_id in (due, not_yet, busy, purged):
            await harvest.set_retention(conn, job_id, 60)
        await harvest.purge_job(conn, purged, "ops", "by hand")

        found = dict(await harvest.due_for_retention(conn, 10_000))

    mine = {due, not_yet, forever, busy, purged}
    assert {job_id: r for job_id, r in found.items() if job_id in mine} == {due: 60.0}


async def test_when_the_retention_round_runs__due_jobs_are_purged_by_retention(
    pool: Pool, store: ObjectStore
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn, ago_s=120, store=store)
        await harvest.set_retention(conn, job_id, 60)
    assert await _objects(store, job_id) == 2

    assert await Retention(pool, 10_000, store).run_once() >= 1

    assert await _objects(store, job_id) == 0

    async with pool.acquire() as conn:
        row = await _purged(conn, job_id)
        assert (row["purged_by"], row["purge_reason"]) == (
            "retention",
            "retention: 60 s after the job ended",
        )
        assert await given.logs_of(conn, job_id) == 0


async def test_when_a_recovery_waits_on_a_purge__it_is_refused_once_the_purge_commits(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn, "failed", state="failed_on_cluster")
        task_id = (await given.task_ids(conn, job_id))[0]
    async with pool.acquire() as purger, pool.acquire() as actor:
        purge = purger.transaction()
        await purge.start()
        await harvest.purge_job(purger, job_id, "ops", "race")
        recovery = asyncio.create_task(
            task_actions.apply_to_task(actor, task_id, TaskAction.RECOVER, "ops")
        )
        await until_blocked(pool, actor.get_server_pid())

        await purge.commit()

        with pytest.raises(Conflict, match=f"job {job_id} was purged at .*: cannot reopen it"):
            await recovery
    async with pool.acquire() as conn:
        task = await tasks_repo.get(conn, task_id)
        job = await jobs_repo.get(conn, job_id)
    assert task is not None and task.state.value == "failed_on_cluster"
    assert job is not None and job.state.value == "failed"


async def test_a_purge_clears_a_jobs_data_in_batches_and_records_when_it_is_done(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: batches smaller than the job's data (two tasks, six log lines)
    monkeypatch.setattr(harvest, "PURGE_LOG_BATCH", 4)
    monkeypatch.setattr(harvest, "PURGE_TASK_BATCH", 1)
    async with pool.acquire() as conn:
        job_id = await _ended_with_data(conn)
        ids = await given.task_ids(conn, job_id)
        # when
        purged = await harvest.purge_job(conn, job_id, "ops", "batches")
        # then everything went, a removal per batch of tasks, and the purge says it is done
        assert (purged.logs, purged.contents, purged.removals) == (6, 2, 2)
        assert await given.logs_of(conn, job_id) == 0
        assert await given.kept_bytes(conn, job_id) == 0
        removals = [
            b["task_ids"] for k, b in await given.outbox_of(conn, job_id) if k.startswith("host.")
        ]
        assert removals == [[ids[0]], [ids[1]]]
        assert await conn.fetchval("SELECT purge_done_at FROM jobs WHERE id = $1", job_id)


async def test_a_purge_cut_short_after_its_mark_is_finished_by_the_scheduler(
    pool: Pool, store: ObjectStore
) -> None:
    async with pool.acquire() as conn:
        # given: a job marked purged a while ago whose purger stopped before clearing it
        job_id = await _ended_with_data(conn, store=store)
        fresh = await _ended_with_data(conn, store=store)
        await harvest.mark_purged(conn, job_id, "ops", "cut short")
        await harvest.mark_purged(conn, fresh, "ops", "being cleared right now")
        await conn.execute(
            "UPDATE jobs SET purged_at = now() - interval '2 minutes' WHERE id = $1", job_id
        )
        assert await given.logs_of(conn, job_id) == 6
    # when
    await Retention(pool, batch=100, store=store).run_once()
    # then its data is gone and the purge is done; the fresh one is left to its purger
    assert (await _objects(store, job_id), await _objects(store, fresh)) == (0, 2)
    async with pool.acquire() as conn:
        assert await given.logs_of(conn, job_id) == 0
        assert await given.kept_bytes(conn, job_id) == 0
        assert await conn.fetchval("SELECT purge_done_at FROM jobs WHERE id = $1", job_id)
        assert await given.logs_of(conn, fresh) == 6
        assert await conn.fetchval("SELECT purge_done_at FROM jobs WHERE id = $1", fresh) is None
