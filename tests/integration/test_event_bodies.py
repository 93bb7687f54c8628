"""Every event body the outbox holds, as a subscriber of the events exchange receives it.

Each statement that writes an event makes its body with its type's SQL function
(`event_body_*`): a repository's one event from Python, a job's `task.new` events, a single
move, a set-based move, a worker's move, a cancel, the finaliser's job ends. One event of each
goes through the relay to a plain aio-pika queue, and each body must have exactly the fields
docs/reference/events.md promises for its `type` ("The events exchange"), with their JSON types,
and read back through its pydantic model as what its writer meant.
"""

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import aio_pika
import pytest
from pydantic import BaseModel

from services.scheduler.relay import Relay
from shared.domain.messages import (
    HostEvent,
    HostState,
    JobEvent,
    JobOutcome,
    TaskDecision,
    TaskEvent,
    decode,
)
from shared.domain.states import FailureClass, JobState, TaskState
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.topology import Topology
from shared.store import db, jobs_repo, outbox, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL, fresh_database, new_namespace

pytestmark = pytest.mark.integration

_NULL = type(None)
#: What every body has.
_EVERY: dict[str, tuple[type, ...]] = {"type": (str,), "message_id": (str,), "sent_at": (str,)}
#: Each type's fields beside those, and the JSON types each may have (docs/reference/events.md).
CONTRACT: dict[str, dict[str, tuple[type, ...]]] = {
    "task_event": {
        "job_id": (str,),
        "task_id": (str,),
        "state": (str,),
        "previous": (str, _NULL),
        "run_number": (int,),
        "host": (str, _NULL),
        "failure_class": (str, _NULL),
        "exit_code": (int, _NULL),
        "signal": (int, _NULL),
        "error_brief": (str, _NULL),
        "seq": (int,),
    },
    "task_decision": {
        "job_id": (str,),
        "task_id": (str,),
        "verdict": (str,),
        "reason": (str,),
        "failure_class": (str, _NULL),
        "seq": (int,),
    },
    "job_event": {
        "job_id": (str,),
        "outcome": (str,),
        "task_id": (str, _NULL),
        "brief": (str, _NULL),
        "seq": (int,),
    },
    "host_event": {
        "host": (str,),
        "state": (str,),
        "reason": (str, _NULL),
        "until": (str, _NULL),
        "by": (str,),
        "seq": (int,),
    },
}


@pytest.fixture(scope="module")
def bodies_database_url() -> Iterator[str]:
    """A database of its own: the relay publishes whatever its outbox holds."""
    with fresh_database("vigil_bodies") as url:
        yield url


@pytest.fixture
async def bpool(bodies_database_url: str) -> AsyncIterator[db.Pool]:
    async with db.open_pool(bodies_database_url, max_size=4) as pool:
        yield pool


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with open_broker(
        AMQP_URL, Topology(new_namespace("bodies-", 8)), name="test-bodies"
    ) as opened:
        yield opened


@pytest.fixture
async def subscriber(broker: Broker) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """A stranger's queue on the events exchange, bound to every job, task and host event."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        channel = await connection.channel()
        exchange = await channel.get_exchange(broker.events.name)
        queue = await channel.declare_queue(exclusive=True)
        for topic in ("task.#", "job.#", "host.#"):
            await queue.bind(exchange, topic)
        yield queue
    finally:
        await connection.close()


async def _received(queue: aio_pika.abc.AbstractQueue, count: int) -> list[tuple[str, Any]]:
    """The next `count` messages of `queue`: (routing key, decoded JSON body), in order."""
    got: list[tuple[str, Any]] = []
    async with queue.iterator(timeout=10) as messages:
        async for message in messages:
            got.append((message.routing_key or "", json.loads(message.body)))
            if len(got) == count:
                break
    return got


def _check_contract(body: dict[str, Any]) -> None:
    """The body has exactly its type's fields, each of a JSON type the contract allows."""
    fields = _EVERY | CONTRACT[body["type"]]
    assert set(body) == set(fields), body["type"]
    for name, value in body.items():
        assert type(value) in fields[name], (body["type"], name, value)
    uuid.UUID(body["message_id"])
    sent_at = datetime.fromisoformat(body["sent_at"])
    assert body["sent_at"].endswith("Z") and sent_at.utcoffset() == timedelta(0)


async def test_every_event_body_has_the_fields_and_types_the_contract_promises(
    bpool: db.Pool, broker: Broker, subscriber: aio_pika.abc.AbstractQueue
) -> None:
    # given one event of each type, written by each kind of statement that writes events
    host = f"h-{uuid.uuid4().hex[:8]}"
    until = datetime(2030, 1, 2, 5, 4, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    async with bpool.acquire() as conn:
        user = await users_repo.ensure_user(
            conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
        )
        job, _ = await jobs_repo.create(  # task.new x3, made with the job's tasks
            conn, user.id, NewJob("demo", "shell", "true", ["a", "b", "c"])
        )
        t0, t1, t2 = await tasks_repo.list_for_job(conn, job.id)
        await tasks_repo.transition(conn, t0.id, TaskState.ON_HOLD)  # a single move
        await tasks_repo.move_tasks(  # a set-based move
            conn, [tasks_repo.Move(t0.id, TaskState.ON_HOLD, TaskState.NEW, clear=True)]
        )
        claim = uuid.uuid4()  # a worker's move through two states
        assert await tasks_repo.set_claim(conn, t1.id, TaskState.NEW, claim, "w-1")
        held = await tasks_repo.get(conn, t1.id)
        assert held is not None
        path = (TaskState.NEW, TaskState.SETTING_UP, TaskState.QUEUED)
        moved = await tasks_repo.Steps(path, changes={"host": host}).of(held, claim).apply(conn)
        assert moved is not None
        async with conn.transaction():  # a cancel: task.terminated x3
            await tasks_repo.cancel_job(conn, job.id, "stopped by a test")
        ended, _ = await jobs_repo.end_finished(conn, [job.id])  # the finaliser's job.failed
        assert ended == {job.id: JobState.FAILED}
        given = [
            TaskEvent(
                job_id=job.id,
                task_id=t2.id,
                state=TaskState.FAILED_ON_CLUSTER,
                previous=TaskState.ON_CPU,
                run_number=2,
                host=host,
                failure_class=FailureClass.SIGNAL,
                exit_code=-9,
                signal=9,
                error_brief="killed by signal 9",
            ),
            TaskDecision(
                job_id=job.id,
                task_id=t2.id,
                verdict="resubmitted",
                reason="a signal",
                failure_class=FailureClass.SIGNAL,
            ),
            JobEvent(job_id=job.id, outcome=JobOutcome.CRASHED, task_id=t2.id, brief="boom"),
            HostEvent(host=host, state=HostState.QUARANTINED, reason="3 crashes", until=until),
        ]
        # and one of each type from Python, every optional field given
        for event in given:
            match event:
                case TaskEvent():
                    await outbox.add_task_event(conn, event)
                case TaskDecision():
                    await outbox.add_task_decision(conn, event)
                case JobEvent():
                    await outbox.add_job_event(conn, event)
                case HostEvent():
                    await outbox.add_host_event(conn, event)

    # when the relay publishes them to the exchange
    relay = Relay(bpool, broker, batch=100)
    while await relay.run_once():
        pass
    received = await _received(subscriber, 15)

    # then each body is its type's, field for field, and reads back as its writer meant
    for _key, body in received:
        _check_contract(body)
    assert [key for key, _ in received] == [
        *[f"task.new.{job.id}"] * 3,
        f"task.on_hold.{job.id}",
        f"task.new.{job.id}",
        f"task.setting_up.{job.id}",
        f"task.queued.{job.id}",
        *[f"task.terminated.{job.id}"] * 3,
        f"job.failed.{job.id}",
        f"task.failed_on_cluster.{job.id}",
        f"task.resubmitted.{job.id}",
        f"job.crashed.{job.id}",
        f"host.quarantined.{host}",
    ]
    seqs = [body["seq"] for _, body in received]
    assert seqs == sorted(set(seqs))  # numbered in the order they were written
    events: list[TaskEvent | TaskDecision | JobEvent | HostEvent] = []
    for _, body in received:
        read = decode(json.dumps(body))
        assert isinstance(read, TaskEvent | TaskDecision | JobEvent | HostEvent)
        assert read.seq == body["seq"]
        events.append(read)
    assert len({e.message_id for e in events}) == len(events)

    def meant(event: BaseModel) -> dict[str, Any]:  # what its writer gave: no id, time, position
        return dict(event.model_dump(exclude={"message_id", "sent_at", "seq"}))

    task = {"job_id": job.id, "run_number": 1, "exit_code": None, "signal": None}
    fresh = task | {"host": None, "failure_class": None, "error_brief": None}
    cancelled = {"failure_class": FailureClass.CANCELLED, "error_brief": "stopped by a test"}
    assert [meant(e) for e in events[:10]] == [
        *(meant(TaskEvent(task_id=t.id, state=TaskState.NEW, **fresh)) for t in (t0, t1, t2)),
        meant(TaskEvent(task_id=t0.id, state=TaskState.ON_HOLD, previous=TaskState.NEW, **fresh)),
        meant(TaskEvent(task_id=t0.id, state=TaskState.NEW, previous=TaskState.ON_HOLD, **fresh)),
        meant(
            TaskEvent(
                task_id=t1.id,
                state=TaskState.SETTING_UP,
                previous=TaskState.NEW,
                **fresh | {"host": host},
            )
        ),
        meant(
            TaskEvent(
                task_id=t1.id,
                state=TaskState.QUEUED,
                previous=TaskState.SETTING_UP,
                **fresh | {"host": host},
            )
        ),
        *(
            meant(
                TaskEvent(
                    task_id=t.id,
                    state=TaskState.TERMINATED,
                    previous=previous,
                    **fresh | {"host": h} | cancelled,
                )
            )
            for t, previous, h in (
                (t0, TaskState.NEW, None),
                (t1, TaskState.QUEUED, host),
                (t2, TaskState.NEW, None),
            )
        ),
    ]
    assert meant(events[10]) == meant(
        JobEvent(job_id=job.id, outcome=JobOutcome.FAILED, brief="job failed")
    )
    assert [meant(e) for e in events[11:]] == [meant(e) for e in given]
    assert received[14][1]["until"] == "2030-01-02T03:04:05.123456Z"  # the same time, in UTC
    assert all(e.sent_at <= datetime.now(UTC) for e in events)
