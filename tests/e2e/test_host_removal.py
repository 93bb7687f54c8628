"""An operator removes a host, against the four services: refused while it is alive and holds a
task, forced with the installed `vigil hosts rm --force` (the task lost, a restartable one run
again), the host's worker stops on its own, the host leaves `GET /hosts`, its queues leave the
broker once its services are gone (as a plain AMQP client sees it), and its worker started
again brings it back with fresh queues, where the task then runs to its end."""

import asyncio
import signal
import subprocess
from typing import Any

import aio_pika
import aiormq
import httpx
import pytest

from shared.messaging.topology import Topology
from tests.conftest import AMQP_URL
from tests.e2e.conftest import HOST_ID, VIGIL, Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

#: Long enough that the task still runs when the host is removed; short enough that its
#: process, left to run after the removal, ends by itself while the test waits.
COMMAND = "sleep 8"


async def _queues_on_broker(namespace: str, host_id: str) -> int:
    """How many of the host's work and supervise queues the broker has, as a client that is no
    part of Vigil finds out: a passive declare of each (404 for a missing one)."""
    topology = Topology(namespace)
    found = 0
    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        for name in (topology.host_queue(host_id), topology.supervisor_queue(host_id)):
            channel = await connection.channel()
            try:
                await channel.declare_queue(name, passive=True)
                found += 1
                await channel.close()
            except aiormq.exceptions.ChannelNotFoundEntity:
                continue  # the failed declare closed the channel
    return found


async def _until(check: Any, within: float) -> None:
    """Until `check()` is true (a broker's queues and a host list are no events: polled)."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.5)


async def _listed(client: httpx.AsyncClient) -> set[str]:
    return {h["id"] for h in (await client.get("/hosts")).json()}


async def test_a_removed_host_is_gone_with_its_queues_and_comes_back_as_a_new_one(
    stack: Stack, client: httpx.AsyncClient, events: Events, env: dict[str, str]
) -> None:
    # given a restartable task running on the only host
    body = {"command": COMMAND, "policy": {"restartable": True}}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}", within=60)
    assert await _queues_on_broker(stack.namespace, HOST_ID) == 2

    # when an operator removes it: refused while it is alive and holds the task
    refused = await client.delete(f"/hosts/{HOST_ID}")
    assert refused.status_code == 409, refused.text
    assert f"vigil hosts drain {HOST_ID}" in refused.json()["next_step"]
    # then forced, with the installed command
    forced = await asyncio.to_thread(
        subprocess.run,
        [str(VIGIL), "hosts", "rm", HOST_ID, "--force"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.strip() == f"host {HOST_ID}: removed, 1 task(s) lost"

    # then the task is lost with the host, the removal is an event, the host is not listed
    removed = await events.wait_key(f"host.removed.{HOST_ID}")
    assert removed["by"] in removed["reason"]
    lost = await events.wait_key(f"task.failed_on_cluster.{job_id}")
    assert lost["failure_class"] == "lost", lost
    assert f"host {HOST_ID} removed by" in (lost["error_brief"] or ""), lost
    assert HOST_ID not in await _listed(client)
    again = await client.delete(f"/hosts/{HOST_ID}")
    assert again.status_code == 404, again.text
    # and its worker stops by itself, saying why
    assert await asyncio.to_thread(stack.procs["worker"].wait, 30) == 0
    assert "was removed by an operator" in stack.log("worker")

    # and once its supervisor has fenced the command (killed, or seen end), it is resubmitted
    await events.wait_key(f"task.resubmitted.{job_id}", within=30)

    # when its supervisor is stopped too, the host's queues leave the broker
    stack.kill("supervisor", signal.SIGTERM)

    async def no_queue_left() -> bool:
        return await _queues_on_broker(stack.namespace, HOST_ID) == 0

    await _until(no_queue_left, within=60)

    # when its services start again, it is back as a new host, with its queues
    stack.start("supervisor")
    stack.start("worker")
    await asyncio.to_thread(stack.wait_healthy, 60)

    async def back() -> bool:
        return HOST_ID in await _listed(client)

    await _until(back, within=30)
    [host] = [h for h in (await client.get("/hosts")).json() if h["id"] == HOST_ID]
    assert not host["draining"], host
    assert await _queues_on_broker(stack.namespace, HOST_ID) == 2
    # and the lost task, restartable, runs again there to its end
    job = await wait_job(client, events, job_id, within=90)
    assert job["state"] == "completed", job
