"""A host's queues end with the host, on the real PostgreSQL and RabbitMQ: the leading
scheduler deletes the work and supervise queues of a dead host (an ended pilot's, or one an
operator removed) that nothing claims any more,
keeps those of a host a task still claims, lets a host that comes back have them again, and
its relay drops a late work or supervise message for a retired host instead of declaring its
queue again (or trying to publish it for ever)."""

import uuid
from collections.abc import AsyncIterator, Iterator

import aiormq
import pytest

from services.scheduler.host_queues import HostQueues, is_retired
from services.scheduler.relay import Relay
from shared.domain.messages import KillTask, RunStage
from shared.domain.scheduling.resources import Resources
from shared.domain.states import Stage
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.topology import (
    Topology,
    declare_all_work_queues,
    delete_all,
    delete_host_queues,
    host_key,
    supervise_key,
)
from shared.operations import host_removal
from shared.store import db, hosts_repo, jobs_repo, outbox, users_repo
from shared.store.db import Connection
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL, fresh_database, new_namespace, require_servers

pytestmark = pytest.mark.integration

DEAD_AFTER_S = 10.0


@pytest.fixture(scope="module")
def host_queues_database_url() -> Iterator[str]:
    with fresh_database("vigil_host_queues") as url:
        yield url


@pytest.fixture
async def hpool(host_queues_database_url: str) -> AsyncIterator[db.Pool]:
    async with db.open_pool(host_queues_database_url, max_size=4) as pool:
        await pool.execute("TRUNCATE outbox RESTART IDENTITY")
        yield pool


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    require_servers()
    topology = Topology(new_namespace("hq-", 8))
    async with open_broker(AMQP_URL, topology, name="test-host-queues") as opened:
        try:
            yield opened
        finally:
            cleanup = await opened.connection.channel()
            await delete_all(cleanup, topology, [])
            await cleanup.close()


async def _host_with_queues(conn: Connection, broker: Broker, host_id: str = "") -> str:
    """Given-step: a host (a new one, or `host_id` back) whose worker registered and declared
    its queues."""
    host_id = host_id or f"h-{uuid.uuid4().hex[:8]}"
    instance = f"w-{uuid.uuid4().hex[:8]}"
    await hosts_repo.register_worker(conn, host_id, instance, "default", Resources.of(1, 0))
    channel = await broker.connection.channel()
    await declare_all_work_queues(channel, broker.topology, host_id)
    await channel.close()
    return host_id


async def _dies(conn: Connection, host_id: str, pilot: bool = True) -> None:
    """Given-step: the host's worker is gone and it has not beaten for a minute; `pilot`: it
    was a pilot whose allocation ended."""
    await conn.execute(
        "UPDATE hosts SET worker = NULL, heartbeat_at = now() - interval '1 minute' WHERE id = $1",
        host_id,
    )
    if pilot:
        await conn.execute(
            "INSERT INTO pilots (id, pool, backend, state, host_id, cpus, walltime_s,"
            " requested_by) VALUES ('p-' || $1, 'default', 'slurm', 'ended', $1, 1, 60, 't')",
            host_id,
        )


async def _dead_host(hpool: db.Pool, broker: Broker) -> str:
    """Given-step: a host that had its queues, and died."""
    async with hpool.acquire() as conn:
        host_id = await _host_with_queues(conn, broker)
        await _dies(conn, host_id)
    return host_id


async def _queues_left(broker: Broker, host_id: str) -> list[str]:
    """The host's queues the broker still has (a passive declare: 404 for a missing one)."""
    left = []
    for name in (broker.topology.host_queue(host_id), broker.topology.supervisor_queue(host_id)):
        channel = await broker.connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
            left.append(name)
        except aiormq.exceptions.ChannelNotFoundEntity:
            continue  # the failed declare closed the channel
        await channel.close()
    return left


async def test_a_dead_host_that_nothing_claims_loses_its_queues_once(
    hpool: db.Pool, broker: Broker
) -> None:
    host_id = await _dead_host(hpool, broker)
    retiring = HostQueues(hpool, broker, DEAD_AFTER_S)

    first = await retiring.run_once()
    again = await retiring.run_once()

    assert await _queues_left(broker, host_id) == []
    assert first >= 1 and again == 0
    async with hpool.acquire() as conn:
        assert await is_retired(conn, host_id)
    await delete_host_queues(broker.channel, broker.topology, host_id)  # idempotent


async def test_a_silent_host_that_is_no_ended_pilot_keeps_its_queues(
    hpool: db.Pool, broker: Broker
) -> None:
    # cut off, its worker process may come back, and it declares its queues only at its start
    async with hpool.acquire() as conn:
        host_id = await _host_with_queues(conn, broker)
        await _dies(conn, host_id, pilot=False)

    await HostQueues(hpool, broker, DEAD_AFTER_S).run_once()

    assert len(await _queues_left(broker, host_id)) == 2


async def test_a_removed_host_loses_its_queues_once_its_supervisor_is_silent_too(
    hpool: db.Pool, broker: Broker
) -> None:
    # given a host an operator removed, whose worker is gone but whose supervisor still beats
    async with hpool.acquire() as conn:
        host_id = await _host_with_queues(conn, broker)
        await _dies(conn, host_id, pilot=False)
        await host_removal.remove(conn, host_id, "op", force=False, dead_after_s=DEAD_AFTER_S)
    queues_left = []
    for supervisor_beat_s_ago in (0, 60):
        await hpool.execute(
            "UPDATE hosts SET supervisor_heartbeat_at = now() - make_interval(secs => $2)"
            " WHERE id = $1",
            host_id,
            supervisor_beat_s_ago,
        )
        await HostQueues(hpool, broker, DEAD_AFTER_S).run_once()
        queues_left.append(len(await _queues_left(broker, host_id)))

    assert queues_left == [2, 0]  # a live supervisor consumes one of them


async def test_a_dead_host_a_task_still_claims_keeps_its_queues(
    hpool: db.Pool, broker: Broker
) -> None:
    async with hpool.acquire() as conn:
        host_id = await _host_with_queues(conn, broker)
        owner = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, owner.id, NewJob("held", "shell", "true", ["a"]))
        await conn.execute(
            "UPDATE tasks SET claim = gen_random_uuid(), host = $2 WHERE job_id = $1",
            job.id,
            host_id,
        )
        await _dies(conn, host_id)

    await HostQueues(hpool, broker, DEAD_AFTER_S).run_once()

    assert len(await _queues_left(broker, host_id)) == 2
    async with hpool.acquire() as conn:
        await conn.execute(
            "UPDATE tasks SET claim = NULL, state = 'completed' WHERE job_id = $1", job.id
        )
    await HostQueues(hpool, broker, DEAD_AFTER_S).run_once()
    assert await _queues_left(broker, host_id) == []


async def test_a_host_that_comes_back_under_its_id_is_not_retired(
    hpool: db.Pool, broker: Broker
) -> None:
    host_id = await _dead_host(hpool, broker)
    await HostQueues(hpool, broker, DEAD_AFTER_S).run_once()

    async with hpool.acquire() as conn:
        again = await _host_with_queues(conn, broker, host_id)
        retired = await is_retired(conn, host_id)
    await HostQueues(hpool, broker, DEAD_AFTER_S).run_once()

    assert (again, retired) == (host_id, False)
    assert len(await _queues_left(broker, host_id)) == 2


async def test_a_late_work_message_for_a_retired_host_is_dropped_not_declared_again(
    hpool: db.Pool, broker: Broker
) -> None:
    relay = Relay(hpool, broker, batch=100)
    async with hpool.acquire() as conn:
        host_id = await _host_with_queues(conn, broker)
        await outbox.add_work(conn, host_key(host_id), _work())
    assert await relay.run_once() == 1  # the host's queue is known to the relay now
    async with hpool.acquire() as conn:
        await _dies(conn, host_id)
    await HostQueues(hpool, broker, DEAD_AFTER_S, on_deleted=relay.forget_host).run_once()

    async with hpool.acquire() as conn:
        await outbox.add_work(conn, host_key(host_id), _work())
        await outbox.add_work(conn, supervise_key(host_id), _kill())
    confirmed = await relay.run_once()
    await relay.run_once()

    assert confirmed == 2
    assert await _queues_left(broker, host_id) == []
    async with hpool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 0


def _work() -> RunStage:
    return RunStage(
        job_id="j-late",
        task_id=f"t-{uuid.uuid4().hex[:8]}",
        stage=Stage.CLUSTER,
        claim=uuid.uuid4(),
    )


def _kill() -> KillTask:
    return KillTask(
        job_id="j-late", task_id=f"t-{uuid.uuid4().hex[:8]}", pid=1, create_time=0.0, reason="lost"
    )
