"""`GET /hosts` on the real database and Redis: heartbeats, running tasks, quarantine."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.domain.scheduling.resources import Resources
from shared.messaging.presence import WorkerIdentity, announce
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.store import hosts_repo
from tests.conftest import REDIS_URL
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str, namespace: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url, namespace=namespace, redis_url=REDIS_URL) as a:
        yield a


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    async with open_redis(REDIS_URL) as client:
        yield client


async def _host(api: Api, *, worker: str | None, worker_age_s: float, **columns: Any) -> str:
    """Given-step: a `hosts` row (its heartbeats `worker_age_s` and the given ages ago)."""
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    await api.pool.execute(
        "INSERT INTO hosts (id, slots, worker, heartbeat_at) VALUES ($1, 4, $2,"
        " now() - make_interval(secs => $3))",
        host_id,
        worker,
        worker_age_s,
    )
    for name, value in columns.items():
        await api.pool.execute(f"UPDATE hosts SET {name} = $2 WHERE id = $1", host_id, value)
    return host_id


async def _tasks_on(api: Api, host_id: str, *states: str) -> None:
    job = await api.submit(api.user, inputs=[str(i) for i in range(len(states))])
    rows = await api.pool.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job["id"])
    for row, state in zip(rows, states, strict=True):
        await api.pool.execute(
            "UPDATE tasks SET state = $2, host = $3 WHERE id = $1", row["id"], state, host_id
        )


def _by_id(hosts: list[dict[str, Any]], host_id: str) -> dict[str, Any]:
    [found] = [h for h in hosts if h["id"] == host_id]
    return found


async def test_when_hosts_work__each_shows_heartbeat_ages_running_tasks_and_quarantine(
    api: Api, redis: Redis, namespace: str
) -> None:
    # given: a live host with a registered worker, three tasks of which two are in flight
    live = await _host(
        api,
        worker="w-1",
        worker_age_s=3,
        supervisor="s-1",
        supervisor_heartbeat_at=await api.pool.fetchval("SELECT now() - interval '1 second'"),
    )
    await announce(redis, RedisKeys(namespace), live, WorkerIdentity("w-1", 1234, 1.5, 4))
    await _tasks_on(api, live, "on_cpu", "queued", "completed")
    # and a quarantined host whose worker is gone
    until = await api.pool.fetchval("SELECT now() + interval '10 minutes'")
    sick = await _host(
        api,
        worker=None,
        worker_age_s=60,
        quarantined=True,
        quarantined_until=until,
        quarantine_reason="5 infra failures within 600 s",
    )

    # when
    response = await api.client.get("/hosts", headers=api.user.headers)

    # then
    assert response.status_code == 200
    hosts = response.json()
    first = _by_id(hosts, live)
    assert first["worker"] == "w-1"
    assert first["worker_registered"] is True
    assert 3 <= first["worker_heartbeat_age_s"] < 10
    assert 1 <= first["supervisor_heartbeat_age_s"] < 10
    assert first["slots"] == 4
    assert first["running_tasks"] == 2
    assert first["quarantined"] is False
    second = _by_id(hosts, sick)
    assert second["worker"] is None
    assert second["worker_registered"] is False
    assert second["worker_heartbeat_age_s"] is None
    assert second["supervisor_heartbeat_age_s"] is None
    assert second["running_tasks"] == 0
    assert second["quarantined"] is True
    assert second["quarantine_reason"] == "5 infra failures within 600 s"
    assert second["quarantined_until"] is not None
    ids = [h["id"] for h in hosts]
    assert ids == sorted(ids)


async def test_when_redis_does_not_answer__hosts_are_listed_with_presence_unknown(
    session_database_url: str,
) -> None:
    async with running_api(session_database_url, redis_url="redis://127.0.0.1:1/0") as api:
        host_id = await _host(api, worker="w-2", worker_age_s=1)
        response = await api.client.get("/hosts", headers=api.operator.headers)
    assert response.status_code == 200
    assert _by_id(response.json(), host_id)["worker_registered"] is None


async def test_without_a_token__401(api: Api) -> None:
    response = await api.client.get("/hosts")
    assert response.status_code == 401


async def test_when_an_operator_quarantines_and_releases_a_host__hosts_shows_it(api: Api) -> None:
    host_id = await _host(api, worker="w-1", worker_age_s=0)
    url = f"/hosts/{host_id}/actions"

    response = await api.client.post(
        url, json={"action": "quarantine", "reason": "disk errors"}, headers=api.operator.headers
    )
    assert response.status_code == 202, response.text
    shown = _by_id((await api.client.get("/hosts", headers=api.user.headers)).json(), host_id)
    assert shown["quarantined"] and "disk errors" in shown["quarantine_reason"]

    response = await api.client.post(url, json={"action": "release"}, headers=api.operator.headers)
    assert response.status_code == 202, response.text
    shown = _by_id((await api.client.get("/hosts", headers=api.user.headers)).json(), host_id)
    assert not shown["quarantined"]


async def test_when_a_host_action_is_wrong__it_is_refused_with_the_reason(api: Api) -> None:
    host_id = await _host(api, worker=None, worker_age_s=0)
    ops = api.operator.headers
    release = {"action": "release"}
    again = await api.client.post(f"/hosts/{host_id}/actions", json=release, headers=ops)
    assert (again.status_code, "not quarantined" in again.text) == (409, True)
    missing = await api.client.post("/hosts/h-nowhere/actions", json=release, headers=ops)
    assert missing.status_code == 404
    unknown = await api.client.post(
        f"/hosts/{host_id}/actions", json={"action": "reboot"}, headers=ops
    )
    assert unknown.status_code == 422
    as_user = await api.client.post(
        f"/hosts/{host_id}/actions", json=release, headers=api.user.headers
    )
    assert as_user.status_code == 403


async def test_when_an_operator_drains_and_undrains_a_host__hosts_shows_it(api: Api) -> None:
    host_id = await _host(api, worker="w-1", worker_age_s=0)
    url, ops = f"/hosts/{host_id}/actions", api.operator.headers

    for _ in range(2):  # draining a draining host is a no-op
        response = await api.client.post(url, json={"action": "drain"}, headers=ops)
        assert response.status_code == 202, response.text
    shown = _by_id((await api.client.get("/hosts", headers=api.user.headers)).json(), host_id)
    assert shown["draining"] and not shown["quarantined"]

    response = await api.client.post(url, json={"action": "undrain"}, headers=ops)
    assert response.status_code == 202, response.text
    shown = _by_id((await api.client.get("/hosts", headers=api.user.headers)).json(), host_id)
    assert not shown["draining"]
    again = await api.client.post(url, json={"action": "undrain"}, headers=ops)
    assert again.status_code == 409
    assert again.json()["next_step"].startswith("nothing to undrain")
    missing = await api.client.post(
        "/hosts/h-nowhere/actions", json={"action": "drain"}, headers=ops
    )
    assert missing.status_code == 404


async def test_an_ended_pilots_host_leaves_the_hosts_but_stays_in_the_pilots_list(
    api: Api,
) -> None:
    # given two pilots' hosts: one whose allocation ended, one running
    ended = await _host(api, worker="w-ended", worker_age_s=1)
    running = await _host(api, worker="w-running", worker_age_s=1)
    for host_id, state in ((ended, "ended"), (running, "running")):
        await api.pool.execute(
            "INSERT INTO pilots (id, pool, backend, state, host_id, batch_job_id, cpus,"
            " walltime_s, requested_by, reason) VALUES ($1, 'default', 'slurm', $2, $3, $4, 1,"
            " 600, 'op', $5)",
            f"p-{uuid.uuid4().hex[:10]}",
            state,
            host_id,
            uuid.uuid4().hex[:6],
            "cancelled" if state == "ended" else None,
        )

    # when
    hosts = (await api.client.get("/hosts", headers=api.user.headers)).json()
    pilots = (await api.client.get("/pilots", headers=api.user.headers)).json()
    metrics = (await api.client.get("/metrics", headers=api.user.headers)).text

    # then the ended one is only in the pilots list, with why it ended
    ids = {h["id"] for h in hosts}
    assert running in ids and ended not in ids
    assert running in metrics and ended not in metrics
    [gone] = [p for p in pilots if p["host_id"] == ended]
    assert (gone["state"], gone["reason"]) == ("ended", "cancelled")


async def test_when_a_host_removal_is_wrong__it_is_refused_with_the_reason(api: Api) -> None:
    host_id = await _host(api, worker=None, worker_age_s=0)
    as_user = await api.client.delete(f"/hosts/{host_id}", headers=api.user.headers)
    assert as_user.status_code == 403
    missing = await api.client.delete("/hosts/h-nowhere", headers=api.operator.headers)
    assert missing.status_code == 404
    bad = await api.client.delete("/hosts/h..%2Fx", headers=api.operator.headers)
    assert bad.status_code in (404, 422)
    assert _by_id((await api.client.get("/hosts", headers=api.user.headers)).json(), host_id)


async def test_a_dead_host_holding_a_task_is_removed_its_task_lost_and_it_comes_back_new(
    api: Api,
) -> None:
    # given a dead host (no beat for an hour) whose worker held a running task, draining
    host_id = await _host(api, worker="w-dead", worker_age_s=3600, draining=True)
    await _tasks_on(api, host_id, "on_cpu")
    await api.pool.execute(
        "UPDATE tasks SET claim = gen_random_uuid(), worker = 'w-dead' WHERE host = $1", host_id
    )

    metrics_before = (await api.client.get("/metrics", headers=api.user.headers)).text

    # when an operator removes it (no --force needed: it is not alive)
    response = await api.client.delete(f"/hosts/{host_id}", headers=api.operator.headers)

    # then its task is lost with it, it is not listed, and its removal is an event
    assert response.status_code == 202, response.text
    assert response.json() == {"host": host_id, "removed": True, "tasks_lost": 1}
    task = await api.pool.fetchrow(
        "SELECT state, claim, failure_class, error_brief FROM tasks WHERE host = $1", host_id
    )
    assert task is not None
    assert (task["state"], task["claim"], task["failure_class"]) == (
        "failed_on_cluster",
        None,
        "lost",
    )
    assert task["error_brief"] == f"host {host_id} removed by {api.operator.user.name}"
    listed = await api.client.get("/hosts", headers=api.user.headers)
    assert host_id not in {h["id"] for h in listed.json()}
    metrics = (await api.client.get("/metrics", headers=api.user.headers)).text
    assert (host_id in metrics_before, host_id in metrics) == (True, False)
    keys = await api.pool.fetch("SELECT routing_key FROM outbox WHERE exchange = 'events'")
    assert f"host.removed.{host_id}" in {k["routing_key"] for k in keys}
    again = await api.client.delete(f"/hosts/{host_id}", headers=api.operator.headers)
    assert again.status_code == 404

    # when a worker registers under its id again, it is back as a new host (not draining);
    # in a pool of its own, so that the session's database keeps no live worker in "default"
    pool = f"p-{uuid.uuid4().hex[:8]}"
    async with api.pool.acquire() as conn:
        await hosts_repo.register_worker(conn, host_id, "w-new", pool, Resources.of(1, 0))
    shown = _by_id((await api.client.get("/hosts", headers=api.user.headers)).json(), host_id)
    assert (shown["worker"], shown["draining"], shown["pool"]) == ("w-new", False, pool)
