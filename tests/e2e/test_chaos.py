"""The chaos run of `bench/chaos.py` with small numbers: every promise holds under fire, the
servers' restarts included."""

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from bench import chaos
from bench.cluster import Cluster
from shared.messaging.topology import Topology, delete_all
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database

pytestmark = pytest.mark.e2e

HOSTS = ["chaos-a", "chaos-b"]


async def _delete_topology(namespace: str) -> None:
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        await delete_all(await connection.channel(), Topology(namespace), HOSTS)
    finally:
        await connection.close()


@pytest.fixture
def cluster(tmp_path: Path, e2e_namespace: str) -> Iterator[Cluster]:
    with fresh_database("vigil_chaos") as url:
        c = Cluster(
            database_url=url,
            amqp_url=AMQP_URL,
            redis_url=REDIS_URL,
            namespace=f"{e2e_namespace}-c{uuid.uuid4().hex[:4]}",
            root=tmp_path,
            hosts=HOSTS,
            extra_env=chaos.CLUSTER_ENV,
        )
        try:
            c.start_all()
            yield c
        finally:
            c.stop_all()
            c.remove_work_root()
            asyncio.run(_delete_topology(c.namespace))
            for name in c.names():
                print(f"----- {name} -----\n{c.log(name)}")  # noqa: T201


@pytest.mark.timeout(300)
async def test_under_chaos__no_job_is_lost_and_no_task_runs_twice_at_once(
    cluster: Cluster,
) -> None:
    # given 30 mixed jobs, while processes, workers and supervisors are killed and frozen,
    # and PostgreSQL, RabbitMQ and Redis each restarted once
    servers = ("postgresql", "rabbitmq", "redis")
    report = await chaos.run(cluster, jobs=30, duration_s=15, seed=20261122, restarts=servers)

    # then every check of the chaos run holds
    print(report.render())  # noqa: T201
    assert report.problems == []
    assert report.jobs == 30
    restarts = {server: report.chaos.pop(f"{server} restarts", 0) for server in servers}
    assert restarts == dict.fromkeys(servers, 1)
    assert sum(report.chaos.values()) >= 2, report.chaos  # kills and freezes besides
