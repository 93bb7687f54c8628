"""A submission releases its job's first tasks in its own transaction, by the dispatcher's rule
(`release_round.release_job`): throttles, prerequisites, emergency stops and the per-user cap
hold as they do for a round."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.domain.messages import RunStage
from shared.domain.states import Stage
from shared.operations import emergency
from tests.integration.test_api_harness import Api, running_api

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


async def test_a_submitted_job_has_its_tasks_claimed_and_their_work_messages_written(
    api: Api,
) -> None:
    job = await api.submit(api.user, command="true", inputs=["a", "b", "c"])

    released = await _released(api, job["id"])
    claims = await _claims(api, job["id"])
    assert [key for key, _ in released] == ["pool.default"] * 3
    assert {m.task_id: m.claim for _, m in released} == claims
    assert all(m.stage is Stage.SETUP for _, m in released)
    assert job["counts"] == {"new": 3}  # released, still new until a worker takes them


async def test_a_throttled_job_releases_no_more_than_its_max_in_flight(api: Api) -> None:
    job = await api.submit(api.user, command="true", inputs=list("abcdef"), max_in_flight=2)

    assert len(await _released(api, job["id"])) == 2
    assert sum(claim is not None for claim in (await _claims(api, job["id"])).values()) == 2


async def test_a_task_waiting_on_a_prerequisite_is_not_released(api: Api) -> None:
    first = await api.submit(api.user, command="true")
    [upstream] = await _claims(api, first["id"])

    job = await api.submit(
        api.user, command="true", inputs=[1], prerequisites={"setup": {upstream: "completed"}}
    )

    assert await _released(api, job["id"]) == []
    assert list((await _claims(api, job["id"])).values()) == [None]


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


async def test_under_a_per_user_cap_a_submission_leaves_the_release_to_the_rounds(
    session_database_url: str,
) -> None:
    # concurrent submissions would not see each other's claims and could pass the cap
    # together; the rounds, one at a time, keep it (test_dispatcher.py)
    async with running_api(session_database_url, max_inputs=10, max_in_flight_per_user=3) as api:
        job = await api.submit(api.user, command="true", inputs=["a", "b"])

        assert await _released(api, job["id"]) == []
        assert set((await _claims(api, job["id"])).values()) == {None}


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


async def test_a_submission_wakes_the_round_only_for_what_it_did_not_release(api: Api) -> None:
    assert await _notified_by_submitting(api, inputs=["a", "b"]) == {"relay"}
    assert await _notified_by_submitting(api, inputs=list("abc"), max_in_flight=1) == {
        "relay",
        "round",
    }
