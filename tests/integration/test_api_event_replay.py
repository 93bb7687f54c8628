"""Replay and resume: `GET /events?after=` / `Last-Event-ID`, 410 past retention, a job's history
(`GET /jobs/{id}/events`), on a served api with the real relay numbering real outbox rows.

The module works in a database of its own: positions are installation-wide, and one test moves
the retention's bound.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aio_pika
import httpx
import pytest

from services.api import sse
from services.scheduler.relay import Relay
from shared.domain.messages import JobEvent, JobOutcome
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology, declare_work_queue, pool_key
from shared.store import event_log, outbox
from tests.conftest import AMQP_URL, fresh_database
from tests.integration.served_api import Served, served_api
from tests.integration.test_api_events import Broker, Frames
from tests.integration.test_api_harness import Caller

pytestmark = pytest.mark.integration

WAIT_S = 10.0


@pytest.fixture(scope="module")
def replay_database_url() -> Iterator[str]:
    with fresh_database("vigil_replay") as url:
        yield url


@pytest.fixture
async def served(replay_database_url: str, namespace: str) -> AsyncIterator[Served]:
    async with served_api(replay_database_url, namespace) as running:
        await running.pool.execute("UPDATE event_positions SET pruned_through = 0")
        yield running


@dataclass
class Relaying:
    """The scheduler's relay on the served api's database and the test's namespace."""

    relay: Relay

    async def all(self) -> None:
        """Publish (and number) everything pending, marks included."""
        while await self.relay.run_once():
            pass
        await self.relay.drain()


@pytest.fixture
async def relaying(served: Served, namespace: str) -> AsyncIterator[Relaying]:
    """The relay, with the pool's queue its submissions' work messages go to (as the
    scheduler declares it at start): a work message it could not route would stay pending,
    ahead of every event, in this module's database."""
    topology = Topology(namespace)
    async with open_broker(AMQP_URL, topology, "test-relay") as broker:
        pool_queue = topology.pool_queue()
        await declare_work_queue(broker.channel, topology, pool_queue, pool_key())
        try:
            yield Relaying(Relay(served.pool, broker, batch=50))
        finally:
            await broker.channel.queue_delete(pool_queue, if_unused=False, if_empty=False)


async def _job_events(served: Served, job_id: str, count: int) -> None:
    """`count` events of the job, each in a transaction of its own."""
    for n in range(count):
        async with served.pool.acquire() as conn, conn.transaction():
            await outbox.add_job_event(
                conn, JobEvent(job_id=job_id, outcome=JobOutcome.FAILED, brief=f"#{n}")
            )


async def _positions(served: Served, job_id: str) -> list[int]:
    async with served.pool.acquire() as conn:
        return [
            e.seq
            for e in await event_log.of_job(conn, job_id, order="oldest", start=None, limit=1000)
        ]


@dataclass(frozen=True)
class Numbered:
    seq: int
    routing_key: str
    body: dict[str, Any]


async def _next_numbered(frames: Frames) -> Numbered:
    """The next event frame with an id (comments skipped)."""
    while True:
        frame = await frames.next()
        if frame.startswith(b":"):
            continue
        id_line, data_line, *_ = frame.decode().split("\n")
        assert id_line.startswith("id: ") and data_line.startswith("data: "), frame
        data = json.loads(data_line.removeprefix("data: "))
        return Numbered(int(id_line.removeprefix("id: ")), data["routing_key"], data["body"])


@asynccontextmanager
async def _stream(
    served: Served, caller: Caller, *patterns: str, headers: dict[str, str] | None = None, **q: Any
) -> AsyncIterator[tuple[Frames, int | None]]:
    """`GET /events` as `caller`: the frames after the opening, and where the stream started."""
    params = httpx.QueryParams([("topic", p) for p in patterns] + list(q.items()))
    async with (
        served.client(caller) as client,
        client.stream("GET", "/events", params=params, headers=headers or {}) as response,
    ):
        assert response.status_code == 200, (await response.aread()).decode()
        frames = Frames(response)
        opening = (await frames.next()).decode()
        assert opening.startswith(": subscribed\n"), opening
        start = opening.split("id: ")[1].strip() if "id: " in opening else None
        yield frames, int(start) if start is not None else None


async def test_a_stream_resumes_after_a_position_then_goes_on_live_without_gap_or_duplicate(
    served: Served, relaying: Relaying
) -> None:
    # given three events of the job, numbered and published
    job_id = await served.submit(served.user)
    await _job_events(served, job_id, 3)
    await relaying.all()
    first, second, third = await _positions_of_outcomes(served, job_id)
    async with _stream(served, served.user, f"job.*.{job_id}", after=first) as (frames, start):
        # when: the stream resumes after the first; then one more happens
        assert start == first
        replayed = [await _next_numbered(frames), await _next_numbered(frames)]
        await _job_events(served, job_id, 1)
        await relaying.all()
        live = await _next_numbered(frames)
    # then: the two it missed, then the new one, each once, with its position in the body
    assert [e.seq for e in replayed] == [second, third]
    assert live.seq > third
    assert [e.body["brief"] for e in (*replayed, live)] == ["#1", "#2", "#0"]
    assert all(e.body["seq"] == e.seq for e in (*replayed, live))


async def test_when_the_broker_connection_is_reestablished__an_open_stream_goes_on_live(
    served: Served, relaying: Relaying, namespace: str
) -> None:
    # given: an open stream on the hub's one connection
    job_id = await served.submit(served.user)
    await relaying.all()
    async with _stream(served, served.operator, f"job.*.{job_id}") as (frames, start):
        connection = served.hub._connection
        assert connection is not None
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())

        # when: the connection drops (its exclusive queue dies with it) and aio-pika makes it
        # again by itself (after its reconnect interval, 5 s); then the job's next event
        # goes out as every event does, numbered by the relay
        assert connection.transport is not None
        await connection.transport.connection.close(ConnectionResetError("dropped by the test"))
        async with asyncio.timeout(WAIT_S + 5):
            await reconnected.wait()
        [name] = served.hub.queue_names()
        await _job_events(served, job_id, 1)
        await relaying.all()

        # then: its delivery brings it at once, not the history's next look (`sse.POLL_S`)
        async with asyncio.timeout(sse.POLL_S / 2):
            event = await _next_numbered(frames)
    assert start is not None
    assert (event.seq, event.routing_key) == (start + 1, f"job.failed.{job_id}")
    assert event.body["brief"] == "#0"
    assert served.hub.connects == 1
    async with asyncio.timeout(WAIT_S):
        await served.hub.wait_idle()
    broker = await aio_pika.connect_robust(AMQP_URL, timeout=10)
    try:
        assert not await Broker(broker, namespace).queue_exists(name)
    finally:
        await broker.close()


async def test_an_event_published_while_a_streams_broker_link_is_down_is_sent_once_it_is_back(
    served: Served, relaying: Relaying, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: an open stream whose quiet looks at the history are an hour apart
    monkeypatch.setattr(sse, "POLL_S", 3600.0)
    job_id = await served.submit(served.user)
    await relaying.all()
    async with _stream(served, served.operator, f"job.*.{job_id}") as (frames, start):
        connection = served.hub._connection
        assert connection is not None and connection.transport is not None
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())

        # when: the connection drops (the stream's exclusive queue dies with it), and the job's
        # next event is published before aio-pika has made it again (a second later): no
        # queue is bound to receive it
        await connection.transport.connection.close(ConnectionResetError("dropped by the test"))
        await _job_events(served, job_id, 1)
        await relaying.all()
        assert not reconnected.is_set()

        # then: the stream sends it anyway, read from the history, long before its next
        # quiet look
        async with asyncio.timeout(WAIT_S + 5):
            event = await _next_numbered(frames)
    assert start is not None
    assert (event.seq, event.routing_key) == (start + 1, f"job.failed.{job_id}")


async def _positions_of_outcomes(served: Served, job_id: str) -> list[int]:
    async with served.pool.acquire() as conn:
        events = await event_log.of_job(conn, job_id, order="oldest", start=None, limit=100)
    return [e.seq for e in events if e.routing_key.startswith("job.")]


async def test_last_event_id_wins_over_after(served: Served, relaying: Relaying) -> None:
    # given
    job_id = await served.submit(served.user)
    await _job_events(served, job_id, 3)
    await relaying.all()
    first, second, third = await _positions_of_outcomes(served, job_id)
    # when an EventSource reconnects: its URL still says after=first, its header says second
    headers = {"Last-Event-ID": str(second)}
    async with _stream(served, served.user, f"job.*.{job_id}", headers=headers, after=first) as (
        frames,
        start,
    ):
        # then
        assert start == second
        assert (await _next_numbered(frames)).seq == third


async def test_a_stream_without_a_position_starts_from_now_and_says_where(
    served: Served, relaying: Relaying
) -> None:
    job_id = await served.submit(served.user)
    await _job_events(served, job_id, 2)
    await relaying.all()
    async with _stream(served, served.operator, "job.*.#") as (frames, start):
        assert start == max(await _positions(served, job_id))
        await _job_events(served, job_id, 1)
        await relaying.all()
        event = await _next_numbered(frames)
    assert event.seq == start + 1
    assert event.body["brief"] == "#0"


@pytest.mark.parametrize("how", ["query", "header"])
async def test_a_position_older_than_the_history_keeps__410_with_where_it_starts(
    served: Served, relaying: Relaying, how: str
) -> None:
    # given: retention removed everything through the newest event
    job_id = await served.submit(served.user)
    await _job_events(served, job_id, 2)
    await relaying.all()
    newest = max(await _positions(served, job_id))
    await served.pool.execute("UPDATE event_positions SET pruned_through = $1", newest)
    async with served.client(served.user) as client:
        # when
        older = str(newest - 1)
        topic = {"topic": f"job.*.{job_id}"}
        if how == "query":
            gone = await client.get("/events", params={**topic, "after": older})
        else:
            gone = await client.get("/events", params=topic, headers={"Last-Event-ID": older})
    # then
    assert gone.status_code == 410
    assert gone.json()["oldest_retained"] == newest + 1
    assert "read the state again" in gone.json()["next_step"]
    async with _stream(served, served.user, f"job.*.{job_id}", after=newest) as (_, start):
        assert start == newest  # having seen the newest pruned one, nothing was missed


@pytest.mark.parametrize("header", ["x", "-1", "1.5", "", "9" * 30])
async def test_a_last_event_id_that_is_not_a_position__422(served: Served, header: str) -> None:
    job_id = await served.submit(served.user)
    async with served.client(served.user) as client:
        response = await client.get(
            "/events", params={"topic": f"job.*.{job_id}"}, headers={"Last-Event-ID": header}
        )
    assert response.status_code == 422, response.text
    assert "not an event position" in response.text


async def test_a_user_replays_only_their_own_jobs(served: Served, relaying: Relaying) -> None:
    theirs = await served.submit(served.other)
    await _job_events(served, theirs, 1)
    await relaying.all()
    async with served.client(served.user) as client:
        stream = await client.get("/events", params={"topic": f"job.*.{theirs}", "after": 0})
        history = await client.get(f"/jobs/{theirs}/events")
    assert stream.status_code == 404
    assert history.status_code == 404


async def test_a_jobs_history_pages_oldest_or_newest_first(
    served: Served, relaying: Relaying
) -> None:
    # given: the job's task.new and five outcomes
    job_id = await served.submit(served.user)
    await _job_events(served, job_id, 5)
    await relaying.all()
    every = await _positions(served, job_id)
    async with served.client(served.user) as client:
        # when: paged three at a time, each way
        oldest: list[int] = []
        params: dict[str, Any] = {"limit": 3}
        while True:
            page = (await client.get(f"/jobs/{job_id}/events", params=params)).json()
            oldest += [e["seq"] for e in page["items"]]
            if page["next"] is None:
                break
            params["after"] = page["next"]
        newest = (
            await client.get(f"/jobs/{job_id}/events", params={"order": "newest", "limit": 2})
        ).json()
        mixed = await client.get(f"/jobs/{job_id}/events", params={"before": 3})
    # then
    assert oldest == every
    assert [e["seq"] for e in newest["items"]] == every[::-1][:2]
    assert newest["next"] == every[-2]
    assert newest["items"][0]["body"]["seq"] == every[-1]
    assert newest["items"][0]["routing_key"] == f"job.failed.{job_id}"
    assert mixed.status_code == 422
    assert "order=newest" in mixed.text


async def test_a_stream_opened_while_events_pour_in_sees_every_position_once_in_order(
    served: Served, relaying: Relaying
) -> None:
    """The seam under load: a stream resuming from the start while events are written and
    relayed without pause gets every position exactly once, in order."""
    job_id = await served.submit(served.user)
    await relaying.all()
    total = 150

    async def pour() -> None:
        for _ in range(total // 5):
            await _job_events(served, job_id, 5)
            await relaying.all()

    writer = asyncio.create_task(pour())
    try:
        await _job_events(served, job_id, 5)  # some before the stream opens
        await relaying.all()
        async with _stream(served, served.operator, "job.*.#", "task.*.#", after=0) as (
            frames,
            _,
        ):
            seen: list[int] = []
            async with asyncio.timeout(60):
                await writer
                async with served.pool.acquire() as conn:
                    last = (await event_log.bounds(conn)).last_given
                while not seen or seen[-1] < last:
                    seen.append((await _next_numbered(frames)).seq)
    finally:
        writer.cancel()
    assert seen == list(range(1, last + 1))  # everything the module's database numbered
