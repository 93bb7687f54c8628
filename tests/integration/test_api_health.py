"""`/healthz`, `/metrics`, and the api's startup checks."""

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.domain.errors import SchemaOutOfDate
from shared.store.db import SCHEDULER_LOCK_KEY
from tests.conftest import (
    ADMIN_DATABASE_URL,
    database_url,
    require_servers,
)
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _live_host(api: Api) -> str:
    """A host of the api's pool whose worker and supervisor just heartbeated."""
    host = f"h-{uuid.uuid4().hex[:8]}"
    await api.pool.execute(
        "INSERT INTO hosts (id, slots, worker, heartbeat_at, supervisor_heartbeat_at, pool)"
        " VALUES ($1, 2, 'w-1', now(), now(), $2)",
        host,
        api.settings.worker_pool,
    )
    return host


async def _health(api: Api) -> tuple[str, list[str]]:
    response = await api.client.get("/healthz")  # no token
    assert response.status_code == 200, response.text
    body = response.json()
    return body["status"], body["reasons"]


async def test_when_everything_it_relies_on_answers__healthz_is_ok_else_degraded_saying_why(
    fresh_url: str,
) -> None:
    async with running_api(fresh_url, worker_pool="hp") as api:
        status, reasons = await _health(api)
        assert status == "degraded"
        assert reasons == [
            "no worker of pool hp has a fresh heartbeat",
            "no supervisor of pool hp has a fresh heartbeat",
            "no scheduler is leading: nothing is released, ended or relayed",
        ]

        host = await _live_host(api)
        scheduler = await asyncpg.connect(fresh_url)  # holds the leader's lock, as one leads
        try:
            await scheduler.execute("SELECT pg_advisory_lock($1)", SCHEDULER_LOCK_KEY)
            assert await _health(api) == ("ok", [])

            await api.pool.execute(
                "UPDATE hosts SET quarantined = true, quarantine_reason = 'disk check',"
                " quarantined_until = '2100-01-01T00:00:00Z' WHERE id = $1",
                host,
            )
            await api.pool.execute(
                "INSERT INTO outbox (exchange, routing_key, body, created_at)"
                " VALUES ('work', 'pool.hp', '{}', now() - interval '1 minute')"
            )
            status, reasons = await _health(api)
            assert status == "degraded"
            assert reasons[0] == (
                "all 1 host(s) of pool hp quarantined until 2100-01-01T00:00:00+00:00 (disk check)"
            )
            assert reasons[1].startswith("events wait 60 s to be published")
        finally:
            await scheduler.close()
        assert "no scheduler is leading" in " ".join((await _health(api))[1])


async def test_when_the_database_is_unreachable__healthz_answers_503(api: Api) -> None:
    await api.pool.close()

    response = await api.client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "reasons": ["reconnecting to PostgreSQL"],
    }


async def test_a_jobs_new_tasks_say_why_they_wait_while_the_pool_cannot_start_them(
    session_database_url: str,
) -> None:
    pool_name = f"p{uuid.uuid4().hex[:8]}"
    async with running_api(session_database_url, worker_pool=pool_name) as api:
        job_id = (await api.submit(api.user, inputs=[1]))["id"]

        async def waiting_on() -> str | None:
            response = await api.client.get(f"/jobs/{job_id}", headers=api.user.headers)
            listed = await api.client.get("/jobs", headers=api.user.headers)
            [same] = [j for j in listed.json()["items"] if j["id"] == job_id]
            assert same["waiting_on"] == response.json()["waiting_on"]
            value: str | None = response.json()["waiting_on"]
            return value

        assert await waiting_on() == f"no worker of pool {pool_name} has a fresh heartbeat"
        host = await _live_host(api)
        assert await waiting_on() is None
        await api.pool.execute(
            "UPDATE hosts SET quarantined = true, breaker = true, quarantine_reason = '5 lost',"
            " quarantined_until = '2100-01-01T00:00:00Z' WHERE id = $1",
            host,
        )
        assert await waiting_on() == (
            f"all 1 host(s) of pool {pool_name} quarantined until 2100-01-01T00:00:00+00:00"
            " (5 lost)"
        )
        await api.pool.execute("UPDATE hosts SET probing_since = now() WHERE id = $1", host)
        assert await waiting_on() == (
            f"all 1 host(s) of pool {pool_name} quarantined; 1 probing, one task at a time"
        )


async def test_when_metrics_are_scraped_without_a_token__the_answer_is_401(api: Api) -> None:
    response = await api.client.get("/metrics")

    assert response.status_code == 401


async def test_when_metrics_are_scraped__submissions_and_tasks_per_state_are_counted(
    api: Api,
) -> None:
    await api.submit(api.user, inputs=[1, 2])

    response = await api.client.get("/metrics", headers=api.user.headers)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "vigil_api_jobs_submitted_total 1.0" in text
    new_tasks = next(
        line for line in text.splitlines() if line.startswith('vigil_tasks{state="new"}')
    )
    assert float(new_tasks.split()[-1]) >= 2
    assert 'vigil_jobs{state="cancelled"}' in text


async def test_when_the_bootstrap_token_is_used_twice__the_same_operator_keeps_it(
    session_database_url: str,
) -> None:
    async with running_api(session_database_url) as first:
        operator = first.operator.user
    async with running_api(session_database_url) as second:
        assert second.operator.user == operator


async def test_when_the_schema_is_not_migrated__the_api_refuses_to_start() -> None:
    # given: an empty database
    require_servers()
    name = f"vigil_test_empty_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        app = create_app(ApiSettings(database_url=database_url(name)))

        # when / then
        with pytest.raises(SchemaOutOfDate, match=r"python -m shared.store.migrate"):
            async with app.router.lifespan_context(app):
                pass
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def test_when_the_bootstrap_token_is_short__the_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        ApiSettings(bootstrap_token="secret")


def test_when_the_bootstrap_token_is_empty__there_is_none() -> None:
    assert ApiSettings(bootstrap_token="").bootstrap_token is None
