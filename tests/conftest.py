"""Fixtures shared by every tier.

Integration and e2e tests use the real PostgreSQL, RabbitMQ and Redis named by
`TEST_DATABASE_URL`, `TEST_AMQP_URL` and `TEST_REDIS_URL` (loopback by default). An unreachable
server skips those tests on a laptop and fails them when `CI` is set (`unavailable`: so does a
missing cgroup controller or privilege). Each test session works in
a database of its own, created and migrated here, and each test in a namespace of its own.
"""

import asyncio
import os
import socket
import subprocess
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from shared.store import db
from shared.store.migrate import migrate
from tests.s3_fixture import s3_env  # noqa: F401  (a fixture: the real SeaweedFS)
from tests.slurm_fixture import slurm_conf  # noqa: F401  (a fixture: the real Slurm)

ADMIN_DATABASE_URL = os.environ.get(
    "TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or default_port)
    try:
        with socket.create_connection(address, 2):
            return True
    except OSError:
        return False


def unavailable(message: str) -> NoReturn:
    """Stop a test that cannot run on this machine, `message` saying what is missing and how
    to get it: skipped on a developer's machine, failed under CI (`CI`, set by .ci/run), where a
    skip would silently drop what the README promises from a green run."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (a skip is a failure under CI)", pytrace=False)
    pytest.skip(message)


def require_root(why: str) -> None:
    """`unavailable` unless this process is root (the worker confines jobs only as root)."""
    if os.geteuid() != 0:
        unavailable(f"{why} needs root: run the tests as root (CI's machine does: .ci/run)")


def require_servers() -> None:
    """Skip (or fail under CI) when one of the three servers does not answer."""
    missing = [
        name
        for name, url, port in (
            ("PostgreSQL", ADMIN_DATABASE_URL, 5432),
            ("RabbitMQ", AMQP_URL, 5672),
            ("Redis", REDIS_URL, 6379),
        )
        if not _reachable(url, port)
    ]
    if missing:
        unavailable(f"not reachable: {', '.join(missing)} (see README: starting the servers)")


def database_url(name: str) -> str:
    """The admin URL with its database replaced by `name`."""
    parts = urlsplit(ADMIN_DATABASE_URL)
    return urlunsplit(parts._replace(path="/" + name))


async def create_database(name: str) -> str:
    """Create and migrate a fresh database; returns its URL."""
    conn = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = database_url(name)
    await migrate(url)
    return url


async def drop_database(name: str) -> None:
    """Drop a database made by `create_database`, closing what still uses it."""
    conn = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A migrated database of its own (URL), dropped on exit; for sync, wide-scoped fixtures."""
    require_servers()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    url = asyncio.run(create_database(name))
    try:
        yield url
    finally:
        asyncio.run(drop_database(name))


@pytest.fixture(scope="session")
def session_database_url() -> Iterator[str]:
    """One migrated database for the whole test session (integration tier)."""
    with fresh_database("vigil_test") as url:
        yield url


@pytest.fixture
async def pool(session_database_url: str) -> AsyncIterator[db.Pool]:
    """A pool on the session database (function-scoped: one event loop per test)."""
    async with db.open_pool(session_database_url, max_size=4) as p:
        yield p


#: Every broker namespace this test session made (`new_namespace`): what it declared there is
#: deleted at the session's end (`_sweep_the_broker`).
_NAMESPACES: set[str] = set()


def new_namespace(prefix: str, digits: int = 12) -> str:
    """A namespace of its own (`<prefix><random hex>`), swept from the broker at the end."""
    made = f"{prefix}{uuid.uuid4().hex[:digits]}"
    _NAMESPACES.add(made)
    return made


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own, for exchanges, queues and Redis keys."""
    return new_namespace("t")


@pytest.fixture(scope="session", autouse=True)
def _sweep_the_broker() -> Iterator[None]:
    """At the session's end, delete every queue and exchange of its namespaces (and of those
    made from them: `<namespace>-...`). Hundreds of quorum queues left over, run after run,
    once wedged the local RabbitMQ (a channel stuck declaring a queue)."""
    yield
    if not _NAMESPACES or not _reachable(AMQP_URL, 5672):
        return
    queues, exchanges = (_broker_names(kind) for kind in ("queues", "exchanges"))
    mine = tuple(_NAMESPACES)
    asyncio.run(
        _delete(
            [q for q in queues if q.startswith(mine)], [x for x in exchanges if x.startswith(mine)]
        )
    )


def _broker_names(kind: str) -> list[str]:
    """The names of the broker's queues or exchanges (`rabbitmqctl`: AMQP cannot list them)."""
    try:
        listed = subprocess.run(
            ["rabbitmqctl", f"list_{kind}", "-q", "--no-table-headers", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"cannot list RabbitMQ's {kind} to delete them: {exc}", stacklevel=1)
        return []
    return listed.stdout.split()


async def _delete(queues: list[str], exchanges: list[str]) -> None:
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        channel = await connection.channel()
        for queue in queues:
            await channel.queue_delete(queue)
        for exchange in exchanges:
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()
