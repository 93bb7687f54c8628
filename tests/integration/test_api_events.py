"""`GET /events`: Server-Sent Events from the events exchange, on a served api and the real broker.

Events are published straight to the namespace's exchange; the stream is read as raw bytes so
that the wire format itself is checked.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
import aiormq
import httpx
import pytest

from shared.domain.messages import JobEvent, JobOutcome, LogRecord, Severity, encode
from shared.domain.topics import MAX_TOPICS
from shared.messaging.topology import Topology, declare_events_exchange
from shared.store import users_repo
from tests.conftest import AMQP_URL
from tests.integration.served_api import Served, served_api
from tests.integration.test_api_harness import Caller

pytestmark = pytest.mark.integration

WAIT_S = 10.0


@pytest.fixture
async def served(session_database_url: str, namespace: str) -> AsyncIterator[Served]:
    async with served_api(session_database_url, namespace) as running:
        yield running


class Broker:
    """Publishes to the test namespace's events exchange and peeks at queues."""

    def __init__(self, connection: aio_pika.abc.AbstractRobustConnection, namespace: str) -> None:
        self.connection = connection
        self.topology = Topology(namespace)

    async def publish(self, routing_key: str, body: bytes) -> None:
        channel = await self.connection.channel()
        exchange = await declare_events_exchange(channel, self.topology)
        await exchange.publish(aio_pika.Message(body), routing_key)
        await channel.close()

    async def queue_exists(self, name: str) -> bool:
        """A passive declare: 404 (not found) or 405 (exclusive to the api's connection)."""
        channel = await self.connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        except aiormq.exceptions.ChannelLockedResource:
            return True
        raise AssertionError(f"queue {name} is not exclusive to the api's connection")


@pytest.fixture
async def broker(namespace: str) -> AsyncIterator[Broker]:
    connection = await aio_pika.connect_robust(AMQP_URL, timeout=10)
    try:
        yield Broker(connection, namespace)
    finally:
        await connection.close()


class Frames:
    """The raw SSE frames of a streaming response, one at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._chunks = response.aiter_raw()
        self._buffer = b""

    async def next(self, within: float = WAIT_S) -> bytes:
        """The next frame, `\\n\\n` included; TimeoutError after `within` s."""
        async with asyncio.timeout(within):
            while b"\n\n" not in self._buffer:
                self._buffer += await anext(self._chunks)
        frame, self._buffer = self._buffer.split(b"\n\n", 1)
        return frame + b"\n\n"

    async def next_event(self, within: float = WAIT_S) -> dict[str, Any]:
        """The next data frame (comments skipped), decoded."""
        async with asyncio.timeout(within):
            while True:
                frame = await self.next(within)
                if not frame.startswith(b":"):
                    assert frame.startswith(b"data: ") and frame.count(b"\n") == 2, frame
                    event: dict[str, Any] = json.loads(frame[len(b"data: ") : -2])
                    return event


@asynccontextmanager
async def stream(
    served: Served, caller: Caller, *patterns: str, **options: Any
) -> AsyncIterator[Frames]:
    """`GET /events` for `patterns` as `caller`, asserting 200 and the opening comment."""
    params = httpx.QueryParams([("topic", p) for p in patterns])
    async with (
        served.client(caller, **options) as client,
        client.stream("GET", "/events", params=params) as response,
    ):
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = Frames(response)
        assert (await frames.next()).startswith(b": subscribed\n")
        yield frames


def _job_event(job_id: str, outcome: JobOutcome = JobOutcome.SUCCEEDED) -> JobEvent:
    return JobEvent(job_id=job_id, outcome=outcome, brief="<b>all done</b>")


async def test_when_a_matching_event_is_published__the_stream_carries_it_as_one_data_line(
    served: Served, broker: Broker
) -> None:
    # given
    job_id = await served.submit(served.user)
    event = _job_event(job_id)
    async with stream(served, served.operator, f"job.*.{job_id}") as frames:
        # when: one event that does not match, then one that does
        await broker.publish(f"log.info.{job_id}", b'{"not": "followed"}')
        await broker.publish(f"job.succeeded.{job_id}", encode(event))

        # then
        frame = await frames.next()
    body = json.loads(encode(event))
    expected = json.dumps({"routing_key": f"job.succeeded.{job_id}", "body": body})
    assert json.loads(frame.removeprefix(b"data: ")) == json.loads(expected)
    assert frame.startswith(b'data: {"routing_key":"job.succeeded.')
    assert frame.endswith(b"}\n\n") and frame.count(b"\n") == 2


async def test_when_a_body_holds_newlines_and_is_not_json__each_event_stays_one_data_line(
    served: Served, broker: Broker
) -> None:
    job_id = await served.submit(served.user)
    record = LogRecord(
        job_id=job_id,
        task_id="t-x",
        run_number=1,
        attempt=1,
        line_no=1,
        severity=Severity.ERROR,
        stream="stderr",
        line="first\nsecond\r\n\n<script>",
    )
    async with stream(served, served.operator, f"log.*.{job_id}") as frames:
        await broker.publish(f"log.error.{job_id}", encode(record))
        await broker.publish(f"log.info.{job_id}", b"plain\ntext")

        first = await frames.next_event()
        second = await frames.next_event()

    assert first["body"]["line"] == "first\nsecond\r\n\n<script>"
    assert second == {"routing_key": f"log.info.{job_id}", "body": "plain\ntext"}


async def test_when_nothing_happens__a_keepalive_comment_comes_every_interval(
    session_database_url: str, namespace: str
) -> None:
    async with (
        served_api(session_database_url, namespace, sse_keepalive_s=0.2) as served,
        stream(served, served.operator, "job.*.*") as frames,
    ):
        assert await frames.next(within=2) == b": keepalive\n\n"
        assert await frames.next(within=2) == b": keepalive\n\n"


async def test_when_the_client_disconnects__its_queue_is_deleted(
    served: Served, broker: Broker
) -> None:
    # given
    async with stream(served, served.operator, "job.*.*", "task.*.*") as frames:
        [name] = served.hub.queue_names()
        assert name.startswith(Topology(served.settings.namespace).follower_queue("x")[:-1])
        assert await broker.queue_exists(name)
        # when: the client goes away
        await frames.response.aclose()

    # then: the api notices at once (the server reads the disconnect), no event needed
    async with asyncio.timeout(WAIT_S):
        await served.hub.wait_idle()
    assert not await broker.queue_exists(name)


async def test_when_several_clients_follow__one_broker_connection_serves_them_all(
    served: Served, broker: Broker
) -> None:
    job_id = await served.submit(served.user)
    async with (
        stream(served, served.operator, "job.*.*") as first,
        stream(served, served.operator, f"job.succeeded.{job_id}") as second,
        stream(served, served.user, f"job.*.{job_id}") as third,
    ):
        assert len(served.hub.queue_names()) == 3
        await broker.publish(f"job.succeeded.{job_id}", encode(_job_event(job_id)))
        for frames in (first, second, third):
            assert (await frames.next_event())["routing_key"] == f"job.succeeded.{job_id}"
    assert served.hub.connects == 1


async def test_when_a_user_follows_their_own_job__they_get_its_events_only(
    served: Served, broker: Broker
) -> None:
    mine = await served.submit(served.user)
    theirs = await served.submit(served.other)
    async with stream(served, served.user, f"job.*.{mine}", f"log.error.{mine}") as frames:
        await broker.publish(f"job.failed.{theirs}", encode(_job_event(theirs)))
        await broker.publish(f"job.failed.{mine}", encode(_job_event(mine, JobOutcome.FAILED)))
        event = await frames.next_event()
    assert event["routing_key"] == f"job.failed.{mine}"
    assert event["body"]["outcome"] == "failed"


@pytest.mark.parametrize("pattern", ["job.*.*", "log.error.#", "task.on_cpu.*", "job.*.#"])
async def test_when_a_user_names_a_wildcard_job__403(served: Served, pattern: str) -> None:
    async with served.client(served.user) as client:
        response = await client.get("/events", params={"topic": pattern})
    assert response.status_code == 403
    assert pattern in response.json()["detail"]


async def test_when_a_user_names_another_users_job__404_as_for_a_missing_one(
    served: Served,
) -> None:
    mine = await served.submit(served.user)
    theirs = await served.submit(served.other)
    async with served.client(served.user) as client:
        other = await client.get(
            "/events", params=[("topic", f"job.*.{mine}"), ("topic", f"log.*.{theirs}")]
        )
        missing = await client.get("/events", params={"topic": "job.*.j-doesnotexist"})
    assert other.status_code == 404
    assert theirs in other.json()["detail"]
    assert missing.status_code == 404


async def test_when_an_operator_names_anyone_s_job_or_wildcards__the_stream_opens(
    served: Served,
) -> None:
    theirs = await served.submit(served.other)
    async with stream(served, served.operator, f"log.*.{theirs}", "task.*.#", "job.crashed.*"):
        assert len(served.hub.queue_names()) == 1


BAD_TOPICS = [
    "",
    "job",
    "job.*",
    "job.*.*.*",
    "jobs.*.*",
    "#.*.*",
    "job.#.*",
    "log.loud.*",
    "task.finished.*",
    "job.on_cpu.*",  # a task state is not a job outcome
    "log.error.J-UPPER",
    "log.error.a#",
    "log.error.*b",
    "log.error.a.b",
    "task..j-1",
    "log.error.j 1",
    "log.error." + "x" * 64,
    "job.*.é",
    "x" * 300,
]


@pytest.mark.parametrize("pattern", BAD_TOPICS)
async def test_when_a_topic_is_malformed__422_names_it(served: Served, pattern: str) -> None:
    async with served.client(served.operator) as client:
        params = httpx.QueryParams([("topic", "job.*.*"), ("topic", pattern)])
        response = await client.get("/events", params=params)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["query", "topic"]
    assert repr(pattern[:100]) in error["msg"]


async def test_when_no_topic_or_too_many_are_given__422(served: Served) -> None:
    too_many = httpx.QueryParams([("topic", f"job.*.j-{i}") for i in range(MAX_TOPICS + 1)])
    async with served.client(served.operator) as client:
        none = await client.get("/events")
        many = await client.get("/events", params=too_many)
    assert none.status_code == 422
    assert "at least one topic" in none.json()["detail"][0]["msg"]
    assert many.status_code == 422
    assert f"at most {MAX_TOPICS}" in many.json()["detail"][0]["msg"]


async def test_without_a_token__401(served: Served) -> None:
    async with served.client() as client:
        response = await client.get("/events", params={"topic": "job.*.*"})
    assert response.status_code == 401


async def test_when_the_broker_does_not_answer__503_and_nothing_is_left_open(
    session_database_url: str, namespace: str
) -> None:
    closed = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1
    async with served_api(session_database_url, namespace, amqp_url=closed) as served:
        async with served.client(served.operator) as client:
            response = await client.get("/events", params={"topic": "job.*.*"})
        assert response.status_code == 503
        assert "broker" in response.json()["detail"]
        assert served.hub.queue_names() == []


async def test_when_the_api_serves_its_most_streams__another_gets_503_until_one_ends(
    session_database_url: str, namespace: str
) -> None:
    async with served_api(session_database_url, namespace, max_event_streams=1) as served:
        async with stream(served, served.operator, "job.*.*"):
            async with served.client(served.operator) as client:
                refused = await client.get("/events", params={"topic": "job.*.*"})
            assert refused.status_code == 503
        async with asyncio.timeout(WAIT_S):
            await served.hub.wait_idle()
        async with stream(served, served.operator, "job.*.*"):
            pass


async def test_when_the_api_stops__open_streams_end_and_their_queues_go(
    session_database_url: str, namespace: str, broker: Broker
) -> None:
    async with served_api(session_database_url, namespace) as served:
        client = served.client(served.operator)
        request = client.build_request("GET", "/events", params={"topic": "job.*.*"})
        response = await client.send(request, stream=True)
        frames = Frames(response)
        assert (await frames.next()).startswith(b": subscribed\nid: ")
        [name] = served.hub.queue_names()
        await served.hub.close()  # what the lifespan's end does
        with pytest.raises((StopAsyncIteration, httpx.HTTPError)):
            while True:
                await frames.next()
        await response.aclose()
        await client.aclose()
    assert not await broker.queue_exists(name)


def _token_id(caller: Caller) -> str:
    token = caller.headers["Authorization"].removeprefix("Bearer ")
    return users_repo.token_id(users_repo.hash_token(token))


@pytest.mark.parametrize("how", ["revoke the token", "disable the user"])
async def test_when_a_followers_token_is_revoked__its_stream_ends_within_a_second(
    session_database_url: str, namespace: str, how: str
) -> None:
    async with served_api(session_database_url, namespace) as served:
        job_id = await served.submit(served.user)
        async with stream(served, served.user, f"job.*.{job_id}") as frames:
            # when an operator revokes the follower's token (or disables them)
            async with served.client(served.operator) as operator:
                if how == "revoke the token":
                    done = await operator.delete(f"/admin/tokens/{_token_id(served.user)}")
                else:
                    done = await operator.post(f"/admin/users/{served.user.user.name}/disable")
                assert done.status_code == 200, done.text

            # then the stream says so and ends, and the token opens no other
            assert await frames.next(within=3) == b": token revoked\n\n"
            with pytest.raises(StopAsyncIteration):
                await frames.next(within=3)
        async with served.client(served.user) as client:
            assert (await client.get("/jobs")).status_code == 401


async def test_a_user_holds_at_most_their_share_of_streams_and_others_keep_theirs(
    session_database_url: str, namespace: str
) -> None:
    async with served_api(session_database_url, namespace, max_event_streams_per_user=2) as served:
        mine = await served.submit(served.user)
        theirs = await served.submit(served.other)
        async with (
            stream(served, served.user, f"job.*.{mine}"),
            stream(served, served.user, f"task.*.{mine}"),
        ):
            # when the user opens a third stream
            async with served.client(served.user) as client:
                refused = await client.get("/events", params={"topic": f"log.*.{mine}"})
            # then it is refused, saying why, and another user and an operator still follow
            assert refused.status_code == 429 and "at most 2" in refused.text
            async with (
                stream(served, served.other, f"job.*.{theirs}"),
                stream(served, served.operator, "job.*.*"),
                stream(served, served.operator, "task.*.*"),
            ):
                pass
        # and once the user's streams are closed, they may open one again
        async with asyncio.timeout(WAIT_S):
            await served.hub.wait_idle()
        async with stream(served, served.user, f"log.*.{mine}"):
            pass
