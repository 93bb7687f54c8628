"""The events exchange read as a stranger reads it (design §7: a public contract).

Queues of a plain AMQP client, bound to the documented topics, get each event of a run as a
message of its own, under its own routing key, with the JSON body the history keeps, its
position in the header `seq` and as the `message_id`. Only aio-pika reads the exchange here:
its name is made from the stack's namespace as docs/reference/events.md tells a subscriber ("The
events exchange"), and the test knows the system only through its HTTP api.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractIncomingMessage

from tests.conftest import AMQP_URL
from tests.e2e.stack import Stack
from tests.e2e.test_happy_path import NORMAL_PATH
from tests.e2e.test_prerequisites import assert_timeline, submit_timeline

pytestmark = pytest.mark.e2e

#: The topics the stranger follows, each on a queue of its own.
TOPICS = ("task.*.*", "job.*.*", "log.error.*", "task.recovered.*")
#: Killed by SIGKILL on its first try; listed for retry in place, it runs again and completes.
KILLED_ONCE = 'if [ "$VIGIL_TRY" = 1 ]; then kill -KILL $$; fi; echo "try $VIGIL_TRY"'


@dataclass(frozen=True)
class Delivery:
    """One message as any AMQP client sees it."""

    routing_key: str
    body: Any
    headers: dict[str, Any]
    message_id: str | None

    @property
    def job_id(self) -> str:
        """The last part of every event's key is its job."""
        return self.routing_key.rsplit(".", 1)[-1]


@dataclass
class Tap:
    """A queue of the stranger's bound to one topic, and what it received, in order."""

    topic: str
    received: list[Delivery] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def add(self, message: AbstractIncomingMessage) -> None:
        delivery = Delivery(
            message.routing_key or "",
            json.loads(message.body),
            dict(message.headers or {}),
            message.message_id,
        )
        async with self.changed:
            self.received.append(delivery)
            self.changed.notify_all()

    async def wait_until(self, done: Callable[[list[Delivery]], bool], within: float = 30) -> None:
        """Until `done` holds of what came; TimeoutError after `within` s."""
        async with asyncio.timeout(within), self.changed:
            await self.changed.wait_for(lambda: done(self.received))

    def of(self, job_id: str) -> list[Delivery]:
        return [d for d in self.received if d.job_id == job_id]

    async def first(self, job_id: str, count: int) -> list[Delivery]:
        """The first `count` deliveries about `job_id`, once they came."""
        await self.wait_until(lambda _received: len(self.of(job_id)) >= count)
        return self.of(job_id)[:count]


@pytest.fixture
async def taps(stack: Stack) -> AsyncIterator[dict[str, Tap]]:
    """A plain, exclusive, server-named queue per topic of `TOPICS`, bound before the test
    acts, on the exchange the services declared (looked up, not declared: it is theirs)."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        channel = await connection.channel()
        exchange = await channel.get_exchange(f"{stack.namespace}.vigil.events")
        found = {topic: Tap(topic) for topic in TOPICS}
        for topic, tap in found.items():
            queue = await channel.declare_queue(exclusive=True)
            await queue.bind(exchange, topic)
            await queue.consume(tap.add, no_ack=True)
        yield found
    finally:
        await connection.close()


async def _submit(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _history(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    """The job's events as the api keeps them, oldest first: `{seq, routing_key, body}`."""
    response = await client.get(f"/jobs/{job_id}/events", params={"limit": 10_000})
    response.raise_for_status()
    return list(response.json()["items"])


def _matches(topic: str, routing_key: str) -> bool:
    """A topic of `*` words only, as the broker matches it."""
    words, parts = topic.split("."), routing_key.split(".")
    return len(words) == len(parts) and all(
        w in ("*", p) for w, p in zip(words, parts, strict=True)
    )


def _ended(job_id: str) -> Callable[[list[Delivery]], bool]:
    """Whether a job's end (`job.succeeded|failed` with no task) is among the deliveries."""
    ends = (f"job.succeeded.{job_id}", f"job.failed.{job_id}")
    return lambda received: any(
        d.routing_key in ends and d.body.get("task_id") is None for d in received
    )


async def _as_kept(tap: Tap, client: httpx.AsyncClient, job_id: str) -> list[Delivery]:
    """The tap's deliveries about a job that ended: exactly the job's events of its topic in
    the history, in order, each a message of its own (its key, its body, its position in the
    header `seq` and as the message id)."""
    kept = [e for e in await _history(client, job_id) if _matches(tap.topic, e["routing_key"])]
    got = await tap.first(job_id, len(kept))
    assert [(d.routing_key, d.body) for d in got] == [(e["routing_key"], e["body"]) for e in kept]
    assert [(d.headers, d.message_id) for d in got] == [
        ({"seq": e["seq"]}, str(e["seq"])) for e in kept
    ]
    return got


def _middles(deliveries: list[Delivery]) -> list[str]:
    """The middle word of each key: a task's state, a job's outcome, a decision's verdict."""
    return [d.routing_key.split(".")[1] for d in deliveries]


async def test_a_plain_amqp_client_gets_each_event_of_a_run_as_a_message_of_its_own(
    client: httpx.AsyncClient, taps: dict[str, Tap]
) -> None:
    # given plain queues bound to task.*.*, job.*.*, log.error.* and task.recovered.*
    tasks, jobs, errors, recoveries = (taps[topic] for topic in TOPICS)

    # when a job completes printing an ERROR line, one is killed once and recovered in place,
    # and one is killed for good
    fine = await _submit(
        client,
        {
            "command": 'echo "ERROR: disk nearly full" >&2; echo fine',
            "policy": {"fail_on_log": []},  # the ERROR line is there for log.error.*
        },
    )
    retry = {"retry_signals": [9], "max_app_retries": 1}
    recovered = await _submit(client, {"command": KILLED_ONCE, "policy": retry})
    crashed = await _submit(client, {"command": "kill -KILL $$"})
    for job_id in (fine, recovered, crashed):
        await jobs.wait_until(_ended(job_id))

    # then each queue got the events of its topic, each on its own, as the history keeps them
    got = {
        (tap.topic, job_id): await _as_kept(tap, client, job_id)
        for tap in (tasks, jobs, recoveries)
        for job_id in (fine, recovered, crashed)
    }
    assert [d.routing_key for d in got["task.*.*", fine]] == [
        f"task.{state}.{fine}" for state in NORMAL_PATH
    ]
    assert [d.body["state"] for d in got["task.*.*", fine]] == NORMAL_PATH
    assert _middles(got["job.*.*", fine]) == ["succeeded"]
    # (the triage's move and its decision are one transaction: the move's event comes first)
    assert _middles(got["task.*.*", recovered]) == [
        *NORMAL_PATH[:4], "failed_on_cluster", "recover_cluster", "recovered",
        "recovering_cluster", *NORMAL_PATH[2:],
    ]  # fmt: skip
    assert _middles(got["task.recovered.*", recovered]) == ["recovered"]
    assert got["task.recovered.*", recovered][0].body["verdict"] == "recovered"
    assert _middles(got["job.*.*", recovered]) == ["crashed", "succeeded"]
    assert _middles(got["job.*.*", crashed]) == ["crashed", "failed"]
    assert [d.body["outcome"] for d in got["job.*.*", crashed]] == ["crashed", "failed"]
    assert got["task.recovered.*", fine] == got["task.recovered.*", crashed] == []
    # and the ERROR line came as a log record of its own, with no position (logs have none)
    [line] = await errors.first(fine, 1)
    assert errors.of(fine) == [line]
    assert (line.routing_key, line.body["line"]) == (f"log.error.{fine}", "ERROR: disk nearly full")
    assert (line.body["severity"], line.body["stream"]) == ("error", "stderr")
    assert "seq" not in line.headers
    # and on each queue of events the positions increase, as the relay sent them
    for tap in (tasks, jobs, recoveries):
        seqs = [d.headers["seq"] for d in tap.received]
        assert seqs == sorted(set(seqs)), tap.topic


def _position(tap: Tap, task_id: str, state: str) -> int:
    for n, delivery in enumerate(tap.received):
        if (
            delivery.routing_key.startswith(f"task.{state}.")
            and delivery.body["task_id"] == task_id
        ):
            return n
    raise AssertionError(
        f"{task_id} never reached {state}: {[d.routing_key for d in tap.received]}"
    )


def _completed(job_id: str) -> Callable[[list[Delivery]], bool]:
    return lambda received: any(d.routing_key == f"task.completed.{job_id}" for d in received)


async def test_the_prerequisite_timeline_can_be_rebuilt_from_a_plain_task_queue_alone(
    client: httpx.AsyncClient, taps: dict[str, Tap]
) -> None:
    # given t1 with a delay in every stage; t2 waits before setup for t1 queued; t3 waits before
    # post-processing for t1 data_ready and t2 completed
    (j1, t1), (j2, t2), (j3, t3) = await submit_timeline(client)

    # when all three complete, as the plain task.*.* queue tells
    tasks = taps["task.*.*"]
    for job_id in (j1, j2, j3):
        await tasks.wait_until(_completed(job_id))

    # then the queue's order alone is the order the design gives
    assert_timeline(lambda task_id, state: _position(tasks, task_id, state), t1, t2, t3)
    # and every task walked the normal path, each event under its own key
    for job_id, task_id in ((j1, t1), (j2, t2), (j3, t3)):
        mine = [d for d in tasks.of(job_id) if d.body["task_id"] == task_id]
        assert [d.body["state"] for d in mine] == NORMAL_PATH
        assert _middles(mine) == NORMAL_PATH
