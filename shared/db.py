"""The asyncpg pool: JSON codecs, a bounded close, and the schema check services start with."""

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from shared.errors import SchemaOutOfDate
from shared.migrate import latest_version

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # asyncpg's classes are generic only in its stubs
    Pool = asyncpg.Pool[asyncpg.Record]
    #: A connection, direct or borrowed from a pool: repositories take either.
    Connection = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Connection = asyncpg.Connection | PoolConnectionProxy


async def _init_connection(conn: "asyncpg.Connection[asyncpg.Record]") -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


@asynccontextmanager
async def open_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> AsyncIterator[Pool]:
    """A pool whose jsonb columns read and write Python values; closed within 5 s on exit."""
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection, command_timeout=30
    )
    try:
        yield pool
    finally:
        try:
            async with asyncio.timeout(5):
                await pool.close()
        except TimeoutError:
            logger.warning("database pool did not close in time; terminating it")
            pool.terminate()


async def check_schema(pool: Pool) -> None:
    """Raise `SchemaOutOfDate` unless every migration this code knows has been applied."""
    want = latest_version()
    try:
        have = await pool.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
    except asyncpg.UndefinedTableError:
        have = 0
    if have < want:
        raise SchemaOutOfDate(
            f"database schema is at version {have}, this code needs {want}: "
            "run `python -m shared.migrate`"
        )


def row_dict(record: asyncpg.Record | None) -> dict[str, Any] | None:
    """A record as a plain dict (None stays None)."""
    return dict(record) if record is not None else None
