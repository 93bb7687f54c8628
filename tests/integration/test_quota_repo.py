"""The count of each user's stored bytes (`shared/store/quota_repo.py`): outputs recorded
count by what they add (a record saved again counts its difference), a charge past the quota
refuses and writes nothing, an upload counts once and then as the store holds it, and a purge
gives its job's outputs back once."""

import uuid

import pytest

from shared.domain.outputs import OutputRecord
from shared.domain.store_quota import OverQuota
from shared.store import db, jobs_repo, outputs_repo, quota_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration

SHA = "a" * 64


async def _job(conn: db.Connection, limit: int | None) -> tuple[str, str, str]:
    """A user with their own quota `limit` and a one-task job of theirs: (user, job, task) ids."""
    name = f"user-{uuid.uuid4().hex[:10]}"
    user = await users_repo.ensure_user(conn, name, "user", uuid.uuid4().hex)
    await quota_repo.set_limit(conn, name, limit)
    job, _ = await jobs_repo.create(conn, user.id, NewJob("q", "shell", "true", ["in"]))
    [task] = await tasks_repo.list_for_job(conn, job.id)
    return user.id, job.id, task.id


def _output(name: str, size: int) -> OutputRecord:
    return OutputRecord(name, name, size, SHA, object_key=f"outputs/x/{name}")


async def _record(conn: db.Connection, job: str, task: str, *outputs: OutputRecord) -> None:
    async with conn.transaction():
        added = await outputs_repo.save(conn, task, 1, "h-1", list(outputs))
        await quota_repo.charge_job(conn, job, added, 0, "outputs")


async def test_outputs_count_by_what_they_add_and_a_charge_past_the_quota_writes_nothing(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        user, job, task = await _job(conn, 100)
        await _record(conn, job, task, _output("a", 60))
        await _record(conn, job, task, _output("a", 50))  # the same output saved again
        with pytest.raises(OverQuota) as refused:
            await _record(conn, job, task, _output("b", 51))
        after = await quota_repo.of_user(conn, user, 0)
        saved = await outputs_repo.latest(conn, task)

    assert (after.used, after.limit) == (50, 100)
    assert sorted(saved) == ["a"]  # the refused output's record rolled back with the charge
    assert (refused.value.usage.used, refused.value.size) == (50, 51)
    assert "stores 50 B (50 bytes) of a quota of 100 B (100 bytes)" in str(refused.value)


async def test_an_upload_counts_once__then_as_the_store_holds_it__and_a_purge_gives_outputs_back(
    pool: db.Pool,
) -> None:
    async with pool.acquire() as conn:
        user, job, task = await _job(conn, None)  # the installation's default: 1000 here
        await _record(conn, job, task, _output("a", 300))
        async with conn.transaction():
            await quota_repo.record_upload(conn, user, SHA, 200, 1000)
            await quota_repo.record_upload(conn, user, SHA, 200, 1000)
        counted = (await quota_repo.of_user(conn, user, 1000)).used
        with pytest.raises(OverQuota):
            async with conn.transaction():
                await quota_repo.record_upload(conn, user, "b" * 64, 501, 1000)
        async with conn.transaction():
            await quota_repo.correct_upload(conn, user, SHA, 250)  # the store holds 250
        corrected = (await quota_repo.of_user(conn, user, 1000)).used
        async with conn.transaction():
            given = await quota_repo.give_back_job(conn, job)
        after_purge = await quota_repo.of_user(conn, user, 1000)

    assert counted == 500
    assert corrected == 550
    assert given == 300
    assert (after_purge.used, after_purge.limit) == (250, 1000)
