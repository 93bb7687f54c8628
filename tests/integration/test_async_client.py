"""`vigil.AsyncClient` against the in-process api through an injected ASGI transport, and over
HTTP (`served_api`) for the event stream, which the ASGI transport cannot carry."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from shared.domain.messages import JobEvent, JobOutcome, LogRecord, Severity, encode
from shared.messaging.topology import Topology, declare_events_exchange
from shared.store import logs_repo
from tests.conftest import AMQP_URL
from tests.integration.served_api import served_api
from tests.integration.test_api_harness import Api, running_api
from vigil import AsyncClient, Conflict, Event, Forbidden, InvalidRequest, NotFound, Unauthorized

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


def _client(api: Api, headers: dict[str, str]) -> AsyncClient:
    token = headers["Authorization"].removeprefix("Bearer ")
    return AsyncClient("http://api", token, http=api.client, poll_s=0.02)


async def test_when_a_job_is_submitted__it_reads_back_with_tasks_and_pages(api: Api) -> None:
    client = _client(api, api.user.headers)
    name = f"async-{uuid.uuid4().hex[:8]}"

    made = [
        (await client.submit({"name": name, "command": "true", "inputs": [n]}))["id"]
        for n in range(3)
    ]
    listed = [job["id"] async for job in client.jobs(name=name, limit=2)]
    tasks = await client.tasks(made[0])
    task = await client.task(tasks[0]["id"])

    assert listed == made[::-1]
    assert (await client.job(made[0]))["counts"] == {"new": 1}
    assert (task["input"], task["attempts"]) == (0, [])


async def test_when_the_api_refuses__the_errors_carry_status_and_reason(api: Api) -> None:
    client = _client(api, api.user.headers)
    job_id = (await client.submit({"command": "true"}))["id"]
    (task,) = await client.tasks(job_id)

    with pytest.raises(Conflict, match="cannot release a task in state new"):
        await client.task_action(task["id"], "release")
    with pytest.raises(InvalidRequest, match="throttle needs max_in_flight"):
        await client.job_action(job_id, "throttle")
    with pytest.raises(NotFound):
        await _client(api, api.other.headers).job(job_id)
    with pytest.raises(Unauthorized):
        await AsyncClient("http://api", "wrong-token", http=api.client).job(job_id)


async def test_when_waiting__it_returns_the_job_once_it_ended(api: Api) -> None:
    client = _client(api, api.user.headers)
    job_id = (await client.submit({"command": "true", "inputs": [1, 2]}))["id"]
    views: list[dict[str, Any]] = []
    first_view = asyncio.Event()

    def on_progress(job: dict[str, Any]) -> None:
        views.append(job)
        first_view.set()

    waiting = asyncio.create_task(client.wait(job_id, on_progress=on_progress))
    async with asyncio.timeout(10):
        await first_view.wait()
        assert not waiting.done()
        await client.job_action(job_id, "cancel")
        final = await waiting

    assert views[0]["state"] == "active"
    assert (final["state"], final["counts"]) == ("cancelled", {"terminated": 2})


async def test_when_following_logs__every_stored_line_comes_and_it_ends_with_the_job(
    api: Api,
) -> None:
    client = _client(api, api.user.headers)
    job_id = (await client.submit({"command": "true"}))["id"]
    (task,) = await client.tasks(job_id)

    async def store(number: int, text: str) -> None:
        record = LogRecord(
            job_id=job_id,
            task_id=task["id"],
            run_number=1,
            attempt=1,
            line_no=number,
            severity=Severity.INFO,
            stream="stdout",
            line=text,
        )
        async with api.pool.acquire() as conn:
            await logs_repo.insert(conn, [record])

    await store(0, "first")
    seen: list[str] = []
    async with asyncio.timeout(10):
        async for line in client.logs(job_id, follow=True):
            seen.append(line["line"])
            if line["line"] == "first":
                await store(1, "second")
                await client.job_action(job_id, "cancel")

    assert seen == ["first", "second"]


async def _publish(namespace: str, routing_key: str, body: bytes) -> None:
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        exchange = await declare_events_exchange(await connection.channel(), Topology(namespace))
        await exchange.publish(aio_pika.Message(body), routing_key)
    finally:
        await connection.close()


async def test_when_a_user_listens_to_their_job__the_callback_gets_its_events(
    session_database_url: str, namespace: str
) -> None:
    async with served_api(session_database_url, namespace) as served:
        token = served.user.headers["Authorization"].removeprefix("Bearer ")
        async with AsyncClient(served.base_url, token) as client:
            # given: a user's callback on their own job, listening
            job_id = (await client.submit({"command": "true"}))["id"]
            seen: list[Event] = []
            opened = asyncio.Event()

            async def on_job(event: Event) -> None:
                seen.append(event)
                client.stop_listening()

            client.on(f"job.*.{job_id}", on_job)
            listening = asyncio.create_task(client.listen(on_open=opened.set))
            async with asyncio.timeout(10):
                await opened.wait()

                # when
                message = JobEvent(job_id=job_id, outcome=JobOutcome.SUCCEEDED, brief="done")
                await _publish(namespace, f"job.succeeded.{job_id}", encode(message))
                await listening

            # then
            (event,) = seen
            assert (event.routing_key, event.body["job_id"]) == (f"job.succeeded.{job_id}", job_id)
            with pytest.raises(Forbidden, match="only their own jobs"):
                async with client.subscribe(["job.*.*"]):
                    pass
