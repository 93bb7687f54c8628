"""The relay on the real PostgreSQL and RabbitMQ: each row published once, deleted after its
confirm without the next batch waiting for the delete, and never read again meanwhile."""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import aiormq
import pytest

from services.scheduler.relay import Relay
from shared.domain.messages import TaskEvent
from shared.domain.states import TaskState
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.topology import Topology
from shared.store import db, outbox
from tests.conftest import AMQP_URL, fresh_database, new_namespace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def relay_database_url() -> Iterator[str]:
    with fresh_database("vigil_relay") as url:
        yield url


@pytest.fixture
async def rpool(relay_database_url: str) -> AsyncIterator[db.Pool]:
    async with db.open_pool(relay_database_url, max_size=4) as pool:
        await pool.execute("TRUNCATE outbox RESTART IDENTITY")
        yield pool


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    topology = Topology(new_namespace("relay-", 8))
    async with open_broker(AMQP_URL, topology, name="test-relay") as opened:
        yield opened


async def test_a_batch_is_published_once_and_deleted_by_the_next_read(
    rpool: db.Pool, broker: Broker
) -> None:
    # given three task events, and a queue that receives them
    job_id = f"j-{uuid.uuid4().hex[:8]}"
    queue = await broker.channel.declare_queue(f"q-{uuid.uuid4().hex[:8]}", exclusive=True)
    await queue.bind(broker.events, f"task.*.{job_id}")
    async with rpool.acquire() as conn:
        for _ in range(3):
            event = TaskEvent(
                job_id=job_id, task_id=f"t-{uuid.uuid4().hex[:8]}", state=TaskState.NEW
            )
            await outbox.add_task_event(conn, event)
    relay = Relay(rpool, broker, batch=100)

    # when a batch is published, then the relay reads again
    first = await relay.run_once()
    async with rpool.acquire() as conn:
        pending_meanwhile = await conn.fetchval("SELECT count(*) FROM outbox")
    again = await relay.run_once()

    # then the rows stayed pending until that read, which did not take them again but deleted them
    assert (first, pending_meanwhile, again, relay.undeleted) == (3, 3, 0, 0)
    async with rpool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 0

    received = [body["task_id"] for body in await _receive(queue, 3)]
    assert len(set(received)) == 3
    assert await queue.get(fail=False, no_ack=True) is None  # nothing twice


async def test_the_last_batch_is_deleted_on_the_way_out(rpool: db.Pool, broker: Broker) -> None:
    # given a batch published, with no read after it
    job_id = f"j-{uuid.uuid4().hex[:8]}"
    async with rpool.acquire() as conn:
        event = TaskEvent(job_id=job_id, task_id=f"t-{uuid.uuid4().hex[:8]}", state=TaskState.NEW)
        await outbox.add_task_event(conn, event)
    relay = Relay(rpool, broker, batch=100)
    assert await relay.run_once() == 1

    # when the relay stops
    await relay.drain()

    # then its row is deleted, and an idle poll finds nothing to publish
    async with rpool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 0
    assert relay.undeleted == 0
    assert await relay.run_once(look_first=True) == 0


async def test_a_work_message_no_queue_would_take_is_refused_not_dropped(broker: Broker) -> None:
    with pytest.raises(aiormq.exceptions.PublishError):
        await broker.publish(
            broker.work, f"host.nowhere-{uuid.uuid4().hex[:8]}", b"{}", mandatory=True
        )


async def test_a_published_message_is_persistent_json(broker: Broker) -> None:
    queue = await broker.channel.declare_queue(f"q-{uuid.uuid4().hex[:8]}", exclusive=True)
    await queue.bind(broker.events, "task.new.j-persistent")
    await broker.publish(broker.events, "task.new.j-persistent", b'{"a":1}', mandatory=False)
    async with asyncio.timeout(10), queue.iterator(no_ack=True) as messages:
        message = await anext(aiter(messages))
    assert (message.body, message.content_type, message.delivery_mode) == (
        b'{"a":1}',
        "application/json",
        aio_pika.DeliveryMode.PERSISTENT,
    )
    assert message.message_id  # each its own


async def test_publishes_made_together_are_each_confirmed_and_arrive_in_order(
    broker: Broker,
) -> None:
    # given a queue bound to the events exchange
    queue = await broker.channel.declare_queue(f"q-{uuid.uuid4().hex[:8]}", exclusive=True)
    await queue.bind(broker.events, "task.new.j-together")
    # when 200 publishes are made at once (their frames written together: frame_batching)
    await asyncio.gather(
        *(
            broker.publish(broker.events, "task.new.j-together", b'{"n": %d}' % n, mandatory=False)
            for n in range(200)
        )
    )
    # then each was confirmed (gather returned) and they arrive once each, in order
    assert [body["n"] for body in await _receive(queue, 200)] == list(range(200))


async def _receive(queue: aio_pika.abc.AbstractQueue, count: int) -> list[dict[str, Any]]:
    """The bodies of the next `count` events `queue` receives, in their order."""
    return [json.loads(message.body) for message in await _messages(queue, count)]


async def test_each_event_goes_as_a_message_of_its_own_under_its_own_key(
    rpool: db.Pool, broker: Broker
) -> None:
    # given a task's take of three events, then one event of another job
    job_id, other_id = f"j-{uuid.uuid4().hex[:8]}", f"j-{uuid.uuid4().hex[:8]}"
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    states = [TaskState.SETTING_UP, TaskState.QUEUED, TaskState.ON_CPU]
    # and queues bound to the last of the three, to the other job, and to everything
    last = await _bound(broker, f"task.on_cpu.{job_id}")
    other = await _bound(broker, f"task.*.{other_id}")
    everything = await _bound(broker, "task.#")
    async with rpool.acquire() as conn:
        for state in states:
            await outbox.add_task_event(
                conn, TaskEvent(job_id=job_id, task_id=task_id, state=state)
            )
        await outbox.add_task_event(
            conn, TaskEvent(job_id=other_id, task_id=task_id, state=TaskState.NEW)
        )

    # when the relay publishes them, in one batch
    assert await Relay(rpool, broker, batch=100).run_once() == 4

    # then a queue bound to everything gets four messages in order, each an event: its own
    # key, its own body, its position in the header `seq` and as its id
    keys = [f"task.{s.value}.{job_id}" for s in states] + [f"task.new.{other_id}"]
    messages = await _messages(everything, 4)
    assert [m.routing_key for m in messages] == keys
    bodies = [json.loads(m.body) for m in messages]
    assert [b["state"] for b in bodies] == [s.value for s in states] + ["new"]
    seqs = [b["seq"] for b in bodies]
    assert seqs == sorted(set(seqs))
    assert [(m.headers, m.message_id) for m in messages] == [({"seq": n}, str(n)) for n in seqs]
    assert await everything.get(fail=False, no_ack=True) is None
    # and a queue bound to one key gets that event alone, and one bound to a job, its event
    (alone,) = await _messages(last, 1)
    assert (alone.routing_key, json.loads(alone.body)) == (keys[2], bodies[2])
    (others,) = await _messages(other, 1)
    assert (others.routing_key, json.loads(others.body)) == (keys[3], bodies[3])
    assert await last.get(fail=False, no_ack=True) is None


async def _bound(broker: Broker, key: str) -> aio_pika.abc.AbstractQueue:
    queue = await broker.channel.declare_queue(f"q-{uuid.uuid4().hex[:8]}", exclusive=True)
    await queue.bind(broker.events, key)
    return queue


async def _messages(
    queue: aio_pika.abc.AbstractQueue, count: int
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """The next `count` messages of `queue`, in their order."""
    received: list[aio_pika.abc.AbstractIncomingMessage] = []
    async with asyncio.timeout(10), queue.iterator(no_ack=True) as messages:
        async for message in messages:
            received.append(message)
            if len(received) == count:
                break
    return received


async def test_the_relay_vacuums_the_outbox_every_so_many_rows_it_deleted(
    rpool: db.Pool, broker: Broker
) -> None:
    # given a relay that vacuums every 4 deleted rows, and 3 rows published and deleted
    job_id = f"j-{uuid.uuid4().hex[:8]}"

    async def add(n: int) -> None:
        async with rpool.acquire() as conn:
            for _ in range(n):
                task_id = f"t-{uuid.uuid4().hex[:8]}"
                await outbox.add_task_event(
                    conn, TaskEvent(job_id=job_id, task_id=task_id, state=TaskState.NEW)
                )

    async def vacuums() -> int:
        async with rpool.acquire() as conn:
            await conn.execute("SELECT pg_stat_force_next_flush()")
            return int(
                await conn.fetchval(
                    "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'outbox'"
                )
            )

    relay = Relay(rpool, broker, batch=100, vacuum_every=4)
    await add(3)
    await relay.run_once()
    await relay.run_once()  # deletes the 3
    before = await vacuums()

    # when a fourth row is published and deleted
    await add(1)
    await relay.run_once()
    after_three_reads = await vacuums()
    await relay.run_once()  # deletes it: 4 since the last vacuum

    # then the outbox was vacuumed once, after the read that deleted the fourth
    assert after_three_reads == before
    assert await vacuums() == before + 1
