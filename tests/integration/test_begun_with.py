"""`db.BegunWith`: a transaction whose `BEGIN` carries its first statements in one message,
otherwise asyncpg's own (commit, rollback, savepoints inside), on pooled and direct
connections."""

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.store.db import BegunWith, Connection, Pool

pytestmark = pytest.mark.integration


@pytest.fixture
async def table(pool: Pool) -> AsyncIterator[str]:
    name = f"begun_{uuid.uuid4().hex[:12]}"
    async with pool.acquire() as conn:
        await conn.execute(f"CREATE TABLE {name} (v text)")
    yield name
    async with pool.acquire() as conn:
        await conn.execute(f"DROP TABLE {name}")


async def _values(pool: Pool, table: str) -> list[str]:
    async with pool.acquire() as conn:
        return [r["v"] for r in await conn.fetch(f"SELECT v FROM {table} ORDER BY v")]


async def _statements_sent(conn: Connection, work: BegunWith) -> int:
    """How many messages the transaction's opening sent (asyncpg logs a query per message)."""
    sent: list[object] = []
    conn.add_query_logger(sent.append)
    try:
        async with work:
            pass
        await asyncio.sleep(0)  # asyncpg calls its query loggers soon, not at once
    finally:
        conn.remove_query_logger(sent.append)
    return len(sent)


async def test_its_first_statements_go_with_its_begin(pool: Pool, table: str) -> None:
    async with pool.acquire() as conn:
        # when a transaction is begun with two statements
        opened = BegunWith(conn, f"INSERT INTO {table} VALUES ('a'); SELECT 1 UNION SELECT 2")
        # then its opening is one message, and the commit one more
        assert await _statements_sent(conn, opened) == 2
        # and the status is its last statement's
        assert opened.status == "SELECT 2"
        assert not conn.is_in_transaction()
    assert await _values(pool, table) == ["a"]


async def test_it_commits_and_keeps_savepoints_inside(pool: Pool, table: str) -> None:
    async with pool.acquire() as conn, BegunWith(conn, f"INSERT INTO {table} VALUES ('a')"):
        # a nested transaction is a savepoint: its failure undoes only its own writes
        with pytest.raises(asyncpg.UniqueViolationError):
            async with conn.transaction():
                await conn.execute(f"INSERT INTO {table} VALUES ('b')")
                raise asyncpg.UniqueViolationError("undo b")
        async with conn.transaction():
            await conn.execute(f"INSERT INTO {table} VALUES ('c')")
        assert conn.is_in_transaction()
    assert await _values(pool, table) == ["a", "c"]


async def test_an_error_inside_rolls_it_all_back(pool: Pool, table: str) -> None:
    async with pool.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with BegunWith(conn, f"INSERT INTO {table} VALUES ('a')"):
                await conn.execute(f"INSERT INTO {table} VALUES ('b')")
                raise RuntimeError("refused")
        assert not conn.is_in_transaction()
        # and the connection takes a transaction again
        async with conn.transaction():
            await conn.execute(f"INSERT INTO {table} VALUES ('c')")
    assert await _values(pool, table) == ["c"]


async def test_a_failed_first_statement_leaves_no_transaction(
    session_database_url: str, table: str, pool: Pool
) -> None:
    conn = await asyncpg.connect(session_database_url)
    try:
        # when the first statements fail after the BEGIN ran
        opening = BegunWith(conn, f"INSERT INTO {table} VALUES ('a'); SELECT 1 / 0")
        with pytest.raises(asyncpg.DivisionByZeroError):
            async with opening:
                pytest.fail("the block ran")  # pragma: no cover - the failure being tested
        # then nothing is left begun, here or in asyncpg's view
        assert not conn.is_in_transaction()
        async with conn.transaction():
            await conn.execute(f"INSERT INTO {table} VALUES ('b')")
    finally:
        await conn.close()
    assert await _values(pool, table) == ["b"]


async def test_it_cannot_be_nested(pool: Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(asyncpg.InterfaceError, match="cannot be nested"):
            async with BegunWith(conn, "SELECT 1"):
                pass  # pragma: no cover - the failure being tested
        # the outer transaction is untouched
        assert await conn.fetchval("SELECT 1") == 1
