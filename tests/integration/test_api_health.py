"""`/healthz`, `/metrics`, and the api's startup checks."""

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.errors import SchemaOutOfDate
from tests.conftest import ADMIN_DATABASE_URL, database_url, require_servers
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def test_when_the_database_answers__healthz_is_ok_without_a_token(api: Api) -> None:
    response = await api.client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_when_the_database_is_unreachable__healthz_answers_503(api: Api) -> None:
    await api.pool.close()

    response = await api.client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"status": "unavailable"}


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
        with pytest.raises(SchemaOutOfDate, match=r"python -m shared.migrate"):
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
