"""Migrations: idempotent, safe to run concurrently, and checked by every service at start."""

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.domain.errors import SchemaOutOfDate
from shared.store import db
from shared.store.migrate import latest_version, migrate, migrations
from tests.conftest import ADMIN_DATABASE_URL, database_url, drop_database, require_servers

pytestmark = pytest.mark.integration


@pytest.fixture
async def empty_database_url() -> AsyncIterator[str]:
    """A database of this test's own with nothing in it (not migrated), dropped afterwards."""
    require_servers()
    name = f"vigil_empty_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield database_url(name)
    finally:
        await drop_database(name)


async def _applied_versions(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    return [r["version"] for r in rows]


async def test_when_migrating_a_migrated_database__nothing_is_applied(
    session_database_url: str,
) -> None:
    before = await _applied_versions(session_database_url)
    assert await migrate(session_database_url) == []
    assert await _applied_versions(session_database_url) == before


async def test_when_migrating_an_empty_database_twice__the_second_run_applies_nothing(
    empty_database_url: str,
) -> None:
    first = await migrate(empty_database_url)
    second = await migrate(empty_database_url)
    assert first == [name for _version, name, _sql in migrations()]
    assert second == []
    assert await _applied_versions(empty_database_url) == [v for v, _n, _s in migrations()]


async def test_when_two_runners_migrate_a_fresh_database_at_once__both_succeed_once_each(
    empty_database_url: str,
) -> None:
    first, second = await asyncio.gather(migrate(empty_database_url), migrate(empty_database_url))
    every_file = [name for _version, name, _sql in migrations()]
    # Each file is applied by exactly one of the two runners.
    assert sorted(first + second) == sorted(every_file)
    assert await _applied_versions(empty_database_url) == [v for v, _n, _s in migrations()]


async def test_when_the_database_is_empty__check_schema_raises_schema_out_of_date(
    empty_database_url: str,
) -> None:
    async with db.open_pool(empty_database_url, max_size=1) as pool:
        with pytest.raises(SchemaOutOfDate, match=r"python -m shared\.store\.migrate"):
            await db.check_schema(pool)


async def test_when_the_database_is_migrated__check_schema_passes(
    session_database_url: str,
) -> None:
    async with db.open_pool(session_database_url, max_size=1) as pool:
        await db.check_schema(pool)


async def test_when_a_migration_is_missing__check_schema_raises_schema_out_of_date(
    empty_database_url: str,
) -> None:
    # given: a database migrated, then one version short of this code
    await migrate(empty_database_url)
    async with db.open_pool(empty_database_url, max_size=1) as pool:
        await pool.execute("DELETE FROM schema_migrations WHERE version = $1", latest_version())
        # when / then
        with pytest.raises(SchemaOutOfDate):
            await db.check_schema(pool)
