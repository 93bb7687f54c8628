"""The pool after the server dropped its connections: a restart, a failover, or an operator's
`pg_terminate_backend`.

PostgreSQL says goodbye (FATAL 57P01) and then closes the socket. Between the two, asyncpg still
counts an idle pooled connection open, and the next query on it fails with an
`InternalClientError`. On a loaded machine that gap lasts long enough for the API's next request
to land in it (seen in CI). `_HeldClose` widens the gap at will: a TCP relay to the real server
that forwards every byte but holds back the server's close until the client writes again.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from shared.store import db
from tests.conftest import ADMIN_DATABASE_URL

#: The frontend's Terminate message: a client closing its connection on purpose.
_TERMINATE = b"X\x00\x00\x00\x04"


class _HeldClose:
    """Relays 127.0.0.1:port to PostgreSQL; a connection the server closed of its own accord
    stays open on the client's side until the client sends something (then it closes)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server_closed = 0
        self.changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._relay, "127.0.0.1", 0)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        server_gone = asyncio.Event()
        said_goodbye = asyncio.Event()
        up = asyncio.create_task(self._upstream(client_r, server_w, server_gone, said_goodbye))
        self._tasks.add(up)
        try:
            with contextlib.suppress(ConnectionError):
                while data := await server_r.read(65536):  # its goodbye included
                    client_w.write(data)
                    await client_w.drain()
            server_gone.set()
            if said_goodbye.is_set():
                return
            async with self.changed:
                self.server_closed += 1
                self.changed.notify_all()
            await up  # the client's side stays open until it writes (or leaves)
        finally:
            client_w.close()
            server_w.close()
            up.cancel()
            self._tasks.discard(up)

    @staticmethod
    async def _upstream(
        client_r: asyncio.StreamReader,
        server_w: asyncio.StreamWriter,
        server_gone: asyncio.Event,
        said_goodbye: asyncio.Event,
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while (data := await client_r.read(65536)) and not server_gone.is_set():
                if data.endswith(_TERMINATE):
                    said_goodbye.set()
                server_w.write(data)
                await server_w.drain()


@pytest.fixture
async def relay(session_database_url: str) -> AsyncIterator[tuple[_HeldClose, str]]:
    parts = urlsplit(session_database_url)
    held = _HeldClose((parts.hostname or "127.0.0.1", parts.port or 5432))
    server = await held.serve()
    port = server.sockets[0].getsockname()[1]
    netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
    try:
        yield held, urlunsplit(parts._replace(netloc=netloc))
    finally:
        server.close()


async def _terminate_all(pool: db.Pool, size: int) -> None:
    """Borrow `size` connections at once (so the pool has opened them), then end their server
    processes while they sit idle in the pool."""
    conns = [await pool.acquire() for _ in range(size)]
    pids = [conn.get_server_pid() for conn in conns]
    for conn in conns:
        await pool.release(conn)
    admin = await asyncpg.connect(ADMIN_DATABASE_URL)
    try:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid", pids)
    finally:
        await admin.close()


async def _wait_closed_by_server(held: _HeldClose, count: int) -> None:
    async with asyncio.timeout(10), held.changed:
        await held.changed.wait_for(lambda: held.server_closed >= count)


async def test_a_read_on_connections_the_server_dropped__is_done_again_on_a_fresh_one(
    relay: tuple[_HeldClose, str],
) -> None:
    held, url = relay
    async with db.open_pool(url, min_size=3, max_size=3) as pool:
        await _terminate_all(pool, 3)
        await _wait_closed_by_server(held, 3)

        pids = [await db.read(pool, lambda conn: conn.fetchval("SELECT pg_backend_pid()"))]
        # The first failure renewed the whole pool: no other stale connection is lent out.
        for _ in range(3):
            async with pool.acquire() as conn:
                pids.append(await conn.fetchval("SELECT pg_backend_pid()"))
        assert all(isinstance(pid, int) for pid in pids)


async def test_a_connection_the_server_drops_under_its_borrower__leaves_with_its_own_error(
    session_database_url: str,
) -> None:
    """The pool marks a connection whose borrower raised, to check it on release. When the
    loss already took the connection from its holder, the borrower's own error must still be
    the one that leaves the block (what callers handle), and the next borrower gets a working
    connection."""
    async with db.open_pool(session_database_url, min_size=1, max_size=1) as pool:
        admin = await asyncpg.connect(ADMIN_DATABASE_URL)
        seen: Exception | None = None
        try:
            with pytest.raises(Exception) as left:
                async with pool.acquire() as conn:
                    await admin.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
                    async with asyncio.timeout(10):
                        # until the loss reached the client, which takes the connection from
                        # its holder (asyncpg then detaches the proxy: no public sign of it)
                        while getattr(conn, "_con", None) is not None:  # noqa: ASYNC110
                            await asyncio.sleep(0.01)
                    try:
                        await conn.fetchval("SELECT 1")
                    except Exception as exc:
                        seen = exc
                        raise
        finally:
            await admin.close()
        assert left.value is seen

        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1


async def test_the_pools_connections_never_plan_a_parallel_query(
    session_database_url: str,
) -> None:
    """A parallel plan starts worker processes: milliseconds for the control plane's short
    statements (a feed's aggregate estimated from a long history went parallel: 8 ms for
    1 ms of work). With parallel plans made as cheap as can be, a plain connection takes one
    and the pool's do not."""
    cheap = (
        "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;"
        " SET min_parallel_table_scan_size = 0"
    )
    query = "EXPLAIN SELECT count(*) FROM generate_series(1, 10) g, pg_class c WHERE c.oid > g"
    plain = await asyncpg.connect(session_database_url)
    try:
        await plain.execute(cheap)
        assert "Gather" in "\n".join(r[0] for r in await plain.fetch(query))
    finally:
        await plain.close()
    async with (
        db.open_pool(session_database_url, min_size=1, max_size=1) as pool,
        pool.acquire() as conn,
    ):
        await conn.execute(cheap)
        assert "Gather" not in "\n".join(r[0] for r in await conn.fetch(query))
