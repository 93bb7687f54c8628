"""An application's callback on cluster failures gets every one exactly once,
though the api restarts while the tasks fail (the client resumes after the last position)."""

import asyncio
import signal
import threading
from collections.abc import Awaitable
from typing import Any

from tests.e2e.conftest import Events
from tests.e2e.stack import Stack
from vigil import Client, Event

WAIT_S = 60.0
INPUTS = 10


async def test_a_listener_gets_every_failure_once_across_an_api_restart(
    stack: Stack, events: Events
) -> None:
    # given: an application's resubmission rule, listening with reconnection
    client = Client(stack.base_url, stack.token)
    failures: list[str] = []
    opened = threading.Event()

    @client.on("task.failed_on_cluster.*")
    def on_failure(event: Event) -> None:
        failures.append(event.body["task_id"])
        if len(set(failures)) == INPUTS:
            client.stop_listening()

    listener = threading.Thread(
        target=client.listen,
        kwargs={"on_open": opened.set, "retry_s": 0.2},
        name="listener",
        daemon=True,
    )
    listener.start()
    try:
        assert opened.wait(15), "the event stream did not open"
        # ten tasks that each fail a few seconds in, four at a time
        body = {
            "name": "failing",
            "command": 'sleep "$VIGIL_INPUT"; exit 3',
            "inputs": [str(1 + n % 3) for n in range(INPUTS)],
        }
        job_id = client.submit(body)["id"]

        def failed(count: int) -> Awaitable[tuple[str, dict[str, Any]]]:
            return events.wait_for(
                lambda k, _b: (
                    sum(key == f"task.failed_on_cluster.{job_id}" for key, _ in events.received)
                    >= count
                ),
                within=WAIT_S,
            )

        # when: the api stops after the first failure, and comes back after one more
        await failed(1)
        opened.clear()
        await asyncio.to_thread(stack.kill, "api", signal.SIGTERM)
        await failed(len(failures) + 1)
        missed_while_down = sum(
            key == f"task.failed_on_cluster.{job_id}" for key, _ in events.received
        ) - len(failures)
        stack.start("api")
        await asyncio.to_thread(stack.wait_healthy)

        # then: every failure reached the callback, once
        await asyncio.to_thread(listener.join, WAIT_S)
        assert not listener.is_alive(), f"the callback saw {len(failures)}: {failures}"
    finally:
        client.stop_listening()
        client.close()
    assert missed_while_down >= 1  # the stream really was down while failures happened
    assert opened.is_set()  # and the listener reopened it
    with Client(stack.base_url, stack.token) as reader:
        task_ids = {t["id"] for t in reader.tasks(job_id)}
    assert sorted(failures) == sorted(task_ids)
