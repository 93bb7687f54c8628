"""Fixtures of the integration tier, beside those of every tier (`tests/conftest.py`)."""

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.conftest import AMQP_URL, REDIS_URL, create_database, drop_database, require_servers
from tests.e2e.links import Link, link_loop


@pytest.fixture
async def fresh_url() -> AsyncIterator[str]:
    """A migrated database of this test's own, dropped after it: for a test that reads a whole
    table (the outbox), or takes the leader's lock, which the session's database shares."""
    require_servers()
    name = f"vigil_test_own_{uuid.uuid4().hex[:8]}"
    url = await create_database(name)
    try:
        yield url
    finally:
        await drop_database(name)


@pytest.fixture
def broker_link() -> Iterator[Link]:
    """The real RabbitMQ, reached through a link the test can cut (`tests.e2e.links`)."""
    require_servers()
    with link_loop() as loop:
        opened = Link(loop, {"amqp": AMQP_URL})
        try:
            yield opened
        finally:
            opened.close()


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A client of the real Redis (a test's keys are its own: named after its namespace)."""
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
def passable_dir() -> Iterator[Path]:
    """A new directory that other uids may pass through (not list): a work root the jobs'
    uids can reach (pytest's tmp dir is private to root)."""
    made = Path(tempfile.mkdtemp(prefix="vigil-stages-", dir="/tmp"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)
