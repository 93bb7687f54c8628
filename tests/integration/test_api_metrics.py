"""`GET /metrics`: figures read from PostgreSQL and Redis at scrape time (design §7, §9).

The module has a database of its own (its figures cover the whole installation); each test
compares a scrape before and after its given-step, so tests do not depend on each other.
"""

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import aio_pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from shared.domain.states import FailureClass, JobState, TaskState
from shared.messaging.presence import WorkerIdentity, announce
from shared.messaging.redis_keys import WORKER_TTL_S, RedisKeys
from shared.messaging.topology import (
    Topology,
    declare_all_work_queues,
    delete_all,
    pool_key,
)
from shared.runtime.config import DEFAULT_POOL
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, str], float]


@pytest.fixture(scope="module")
def own_database() -> Iterator[str]:
    with fresh_database("vigil_metrics") as url:
        yield url


@pytest.fixture
async def api(own_database: str, namespace: str) -> AsyncIterator[Api]:
    async with running_api(own_database, namespace=namespace) as running:
        yield running


@pytest.fixture
async def redis(namespace: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    found = [k async for k in client.scan_iter(f"{namespace}:*")]
    if found:
        await client.delete(*found)
    await client.aclose()


async def _scrape(api: Api) -> Samples:
    """Every sample as {(name, the value of its one label or ""): value}."""
    response = await api.client.get("/metrics", headers=api.user.headers)
    assert response.status_code == 200, response.text
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            label = next(iter(sample.labels.values()), "")
            samples[(sample.name, label)] = sample.value
    return samples


async def _task(api: Api) -> str:
    job = await api.submit(api.user)
    return str(await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", job["id"]))


async def test_when_scraped__every_job_and_task_state_and_failure_class_has_a_sample(
    api: Api,
) -> None:
    samples = await _scrape(api)

    for job_state in JobState:
        assert ("vigil_jobs", job_state.value) in samples
    for task_state in TaskState:
        assert ("vigil_tasks", task_state.value) in samples
    for failure_class in FailureClass:
        assert ("vigil_attempts_failed", failure_class.value) in samples
    for exchange in ("events", "work"):
        assert ("vigil_outbox_pending", exchange) in samples


async def test_when_attempts_fail__they_are_counted_per_failure_class(api: Api) -> None:
    # given
    before = await _scrape(api)
    task_id = await _task(api)
    for number, failure_class in enumerate(["signal", "signal", "hung", None], start=1):
        await api.pool.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, ended_at, failure_class)"
            " VALUES ($1, $2, 1, 'cluster', now(), $3)",
            task_id,
            number,
            failure_class,
        )

    # when
    after = await _scrape(api)

    # then
    def delta(failure_class: str) -> float:
        key = ("vigil_attempts_failed", failure_class)
        return after[key] - before[key]

    assert (delta("signal"), delta("hung"), delta("lost")) == (2, 1, 0)


async def test_when_jobs_are_submitted__tasks_states_and_the_outbox_backlog_grow(
    api: Api,
) -> None:
    before = await _scrape(api)

    await api.submit(api.user, inputs=["a", "b", "c"])
    after = await _scrape(api)

    assert after[("vigil_tasks", "new")] - before[("vigil_tasks", "new")] == 3
    assert after[("vigil_jobs", "active")] - before[("vigil_jobs", "active")] == 1
    # no relay runs here: the three task.new events wait in the outbox
    pending = ("vigil_outbox_pending", "events")
    assert after[pending] - before[pending] == 3
    assert after[("vigil_api_jobs_submitted_total", "")] == 1


async def test_when_a_stop_is_in_force__the_gauge_says_so(api: Api) -> None:
    stop_url, headers = "/admin/emergency-stop", api.operator.headers
    assert (await _scrape(api))[("vigil_emergency_stop_in_force", "")] == 0
    assert (
        await api.client.post(stop_url, json={"reason": "t"}, headers=headers)
    ).status_code == 202
    try:
        assert (await _scrape(api))[("vigil_emergency_stop_in_force", "")] == 1
    finally:
        assert (await api.client.post("/admin/resume", headers=headers)).status_code == 202
    assert (await _scrape(api))[("vigil_emergency_stop_in_force", "")] == 0


async def _hosts(api: Api) -> tuple[str, str]:
    """Given-step: a host whose worker heartbeats, one silent for 30 s (both in PostgreSQL)."""
    live, silent = f"h-live-{uuid.uuid4().hex[:6]}", f"h-silent-{uuid.uuid4().hex[:6]}"
    await api.pool.execute(
        "INSERT INTO hosts (id, slots, heartbeat_at) VALUES ($1, 2, now() - interval '3 seconds'),"
        " ($2, 2, now() - interval '30 seconds')",
        live,
        silent,
    )
    return live, silent


async def test_when_hosts_heartbeat__their_ages_come_from_the_worker_registrations(
    api: Api, redis: Redis, namespace: str
) -> None:
    # given: the live host's worker registered just now (its TTL is full)
    live, silent = await _hosts(api)
    identity = WorkerIdentity(instance="w-1", pid=os.getpid(), create_time=1.0, slots=2)
    await announce(redis, RedisKeys(namespace), live, identity)

    # when
    samples = await _scrape(api)

    # then
    assert samples[("vigil_host_worker_registered", live)] == 1
    assert samples[("vigil_host_worker_registered", silent)] == 0
    assert 0 <= samples[("vigil_host_heartbeat_age_seconds", live)] < 2  # not PostgreSQL's 3 s
    assert 30 <= samples[("vigil_host_heartbeat_age_seconds", silent)] < 40


async def test_when_a_registration_ages__the_age_is_what_its_ttl_has_lost(
    api: Api, redis: Redis, namespace: str
) -> None:
    live, _ = await _hosts(api)
    key = RedisKeys(namespace).worker(live)
    await redis.hset(key, "instance", "w-1")
    await redis.pexpire(key, (WORKER_TTL_S - 4) * 1000)

    age = (await _scrape(api))[("vigil_host_heartbeat_age_seconds", live)]

    assert 4 <= age < 5


async def test_when_redis_is_down__metrics_are_served_with_postgresql_ages_only(
    own_database: str,
) -> None:
    async with running_api(own_database, redis_url="redis://127.0.0.1:1/0") as api:
        _, silent = await _hosts(api)

        samples = await _scrape(api)

        assert 30 <= samples[("vigil_host_heartbeat_age_seconds", silent)] < 40
        assert not any(name == "vigil_host_worker_registered" for name, _ in samples)


async def test_when_metrics_are_scraped_without_a_token__the_answer_is_401(api: Api) -> None:
    response = await api.client.get("/metrics")

    assert response.status_code == 401


async def test_when_failures_were_detected__their_latencies_form_a_histogram_per_class(
    api: Api,
) -> None:
    # given failed attempts detected after 0.02 s, 0.3 s and 3 s (and one not measured)
    task_id = await _task(api)
    for number, latency in enumerate([0.02, 0.3, 3.0, None], start=1):
        await api.pool.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, ended_at,"
            " failure_class, detected_after_s) VALUES ($1, $2, 1, 'cluster', now(), 'lost', $3)",
            task_id,
            number,
            latency,
        )

    # when
    response = await api.client.get("/metrics", headers=api.user.headers)

    # then the lost class's histogram counts them cumulatively, with their sum
    samples = {
        (s.name, s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(response.text)
        if family.name == "vigil_detection_latency_seconds"
        for s in family.samples
        if s.labels.get("failure_class") == "lost"
    }
    bucket = "vigil_detection_latency_seconds_bucket"
    assert samples[(bucket, "0.025")] == 1
    assert samples[(bucket, "0.5")] == 2
    assert samples[(bucket, "5.0")] == 3
    assert samples[(bucket, "+Inf")] == 3
    assert samples[("vigil_detection_latency_seconds_count", "")] == 3
    assert samples[("vigil_detection_latency_seconds_sum", "")] == pytest.approx(3.32)


async def test_a_quarantined_host_and_a_probing_one_are_told_apart(api: Api) -> None:
    shut, probing = await _hosts(api)
    await api.pool.execute(
        "UPDATE hosts SET quarantined = true, breaker = true,"
        " probing_since = CASE WHEN id = $2 THEN now() END WHERE id IN ($1, $2)",
        shut,
        probing,
    )

    samples = await _scrape(api)

    assert samples[("vigil_host_quarantined", shut)] == 1
    assert samples[("vigil_host_probing", shut)] == 0
    assert samples[("vigil_host_quarantined", probing)] == 1
    assert samples[("vigil_host_probing", probing)] == 1


async def test_the_pool_the_leader_the_outbox_lag_and_the_queues_are_exported(
    api: Api, namespace: str
) -> None:
    # given: the installation's queues, a dead letter in the DLQ, two new tasks in the pool
    # queue, an unpublished outbox row a minute old, and one live host of the pool
    topology = Topology(namespace)
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        await declare_all_work_queues(channel, topology, "h-metrics")
        dlx = await channel.get_exchange(topology.dead_letter_exchange)
        await dlx.publish(aio_pika.Message(b"{}"), routing_key="")
        work = await channel.get_exchange(topology.work_exchange)
        for _ in range(2):
            await work.publish(aio_pika.Message(b"{}"), routing_key=pool_key(DEFAULT_POOL))
        await api.pool.execute(
            "INSERT INTO outbox (exchange, routing_key, body) VALUES ('work', 'pool.x', '{}')"
        )
        await api.pool.execute(  # nothing relays in this database: the backlog waited a minute
            "UPDATE outbox SET created_at = now() - interval '1 minute'"
        )
        await api.pool.execute(
            "INSERT INTO hosts (id, slots, worker, heartbeat_at, pool)"
            " VALUES ($1, 2, 'w-1', now(), $2)",
            f"h-{uuid.uuid4().hex[:6]}",
            DEFAULT_POOL,
        )

        # when
        samples = await _scrape(api)
    finally:
        try:
            await delete_all(await connection.channel(), topology, ["h-metrics"])
        finally:
            await connection.close()

    # then
    assert samples[("vigil_queue_messages", "dead_letters")] == 1
    assert samples[("vigil_queue_messages", "pool")] == 2
    assert samples[("vigil_outbox_oldest_seconds", "")] >= 60
    assert samples[("vigil_scheduler_leading", "")] == 0  # no scheduler runs here
    assert samples[("vigil_pool_hosts", "live")] >= 1
    assert samples[("vigil_pool_hosts", "open")] >= 1
