"""A submission places none of its job's tasks itself: the leading scheduler's
planning round places them by the pool's free capacity, and the submission wakes it. An
emergency stop in force holds the job it makes."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.domain.messages import RunStage
from shared.operations import emergency, stop_guard
from shared.store import emergency_repo
from tests.integration.test_api_harness import Api, running_api
from tests.integration.waiting import until_someone_blocked

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url, max_inputs=10) as api:
        yield api


async def _released(api: Api, job_id: str) -> list[tuple[str, RunStage]]:
    """The work messages written for the job's tasks: (routing key, message), in order."""
    rows = await api.pool.fetch(
        "SELECT routing_key, body FROM outbox WHERE exchange = 'work' AND body->>'job_id' = $1"
        " ORDER BY id",
        job_id,
    )
    return [(r["routing_key"], RunStage.model_validate(r["body"])) for r in rows]


async def _claims(api: Api, job_id: str) -> dict[str, Any]:
    rows = await api.pool.fetch("SELECT id, claim FROM tasks WHERE job_id = $1", job_id)
    return {r["id"]: r["claim"] for r in rows}


async def test_a_submission_places_nothing_itself_and_wakes_the_round(api: Api) -> None:
    # the leading scheduler's planning round places new tasks, by the pool's free capacity:
    # a submission cannot see what other submissions are placing meanwhile
    assert await _notified_by_submitting(api, inputs=["a", "b"]) == {"relay", "round"}
    job = await api.submit(api.user, command="true", inputs=["a", "b", "c"])

    assert await _released(api, job["id"]) == []
    assert set((await _claims(api, job["id"])).values()) == {None}
    assert job["counts"] == {"new": 3}


@pytest.mark.parametrize("per_user_cap", [None, 3])
async def test_a_job_submitted_during_an_emergency_stop_is_held_by_it_not_released(
    session_database_url: str, per_user_cap: int | None
) -> None:
    async with running_api(
        session_database_url, max_inputs=10, max_in_flight_per_user=per_user_cap
    ) as api:
        async with api.pool.acquire() as conn:
            await emergency.stop(conn, "op", f"release test {uuid.uuid4().hex[:6]}")
        try:
            job = await api.submit(api.user, command="true", inputs=["a"])
            assert job["state"] == "suspended"
            assert await _released(api, job["id"]) == []
        finally:
            async with api.pool.acquire() as conn:
                await emergency.resume(conn, "op")
        # the stop held it as its own: its lifting resumed it
        state = await api.pool.fetchval("SELECT state FROM jobs WHERE id = $1", job["id"])
        assert state == "active"


async def test_a_submission_that_waits_for_a_stop_is_held_by_it(api: Api) -> None:
    # given a stop under way: its lock held, its record written, not yet committed
    async with api.pool.acquire() as stop:
        stopping = stop.transaction()
        await stopping.start()
        try:
            await stop.execute("SELECT pg_advisory_xact_lock($1)", stop_guard.LOCK_KEY)
            await emergency_repo.record_stop(stop, "op", f"race {uuid.uuid4().hex[:6]}")
            # when a job is submitted meanwhile (it waits for the lock), and the stop commits
            submitting = asyncio.create_task(api.submit(api.user, command="true", inputs=["a"]))
            await until_someone_blocked(api.pool)
        except BaseException:
            await stopping.rollback()
            raise
        await stopping.commit()
    job = await submitting
    try:
        # then the submission saw the stop that committed while it waited: its job is held
        assert job["state"] == "suspended"
        held = await api.pool.fetchval(
            "SELECT count(*) FROM emergency_stop_jobs WHERE job_id = $1", job["id"]
        )
        assert held == 1
    finally:
        async with api.pool.acquire() as conn:
            await emergency.resume(conn, "op")


async def _notified_by_submitting(api: Api, **body: Any) -> set[str]:
    """The outbox notifications the commit of a submission of `body` sent."""
    got: asyncio.Queue[str] = asyncio.Queue()
    async with api.pool.acquire() as listener:

        def heard(*args: object) -> None:
            got.put_nowait(str(args[-1]))

        await listener.add_listener("vigil_outbox", heard)
        try:
            await api.submit(api.user, command="true", **body)
            await listener.execute("SELECT 1")  # a notification sent is read by now
        finally:
            await listener.remove_listener("vigil_outbox", heard)
    return {got.get_nowait() for _ in range(got.qsize())}
