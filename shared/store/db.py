"""The asyncpg pool: JSON codecs, a bounded close, recovery from dropped connections, and the
schema check services start with."""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

import asyncpg
import asyncpg.transaction
from asyncpg.pool import PoolConnectionProxy

from shared.domain.errors import CONNECTION_LOST, UNAVAILABLE, SchemaOutOfDate
from shared.runtime.health import Check
from shared.runtime.ride_out import ride_out
from shared.store.migrate import latest_version

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


#: The advisory lock the leading scheduler holds on its session (`services/scheduler/leader.py`);
#: the api's health looks for it in `pg_locks`.
SCHEDULER_LOCK_KEY: Final = 0x56494753  # "VIGS"


#: Turns generic plans on for the rest of the transaction: a `SELECT` list item, put in a
#: statement the transaction runs anyway where there is one (`stop_guard.share`), else in its
#: `BEGIN`'s message (`BegunWith`: the dispatcher's round). PostgreSQL's default plans a
#: prepared statement anew at each call while it judges its parameters may change the plan (the
#: first five calls always): a submission's release statement cost 1.4 ms to plan for 0.4 ms
#: of work, every other call under W1. Only for statements whose plan the parameters do not
#: change (lookups by key, not optional filters such as `$1 IS NULL OR owner_id = $1`, which
#: need a plan per call to use an index).
GENERIC_PLANS: Final = "set_config('plan_cache_mode', 'force_generic_plan', true)"

T = TypeVar("T")


class _Connection(asyncpg.Connection):
    """asyncpg's connection, remembering whether its borrower saw an exception."""

    __slots__ = ("_suspect",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._suspect = False

    def suspect(self) -> None:
        """Its borrower raised: check it before it is lent out again."""
        self._suspect = True

    def cleared(self) -> bool:
        """Whether it was suspect (and is not any more)."""
        was, self._suspect = self._suspect, False
        return was


class _Borrowing(asyncpg.pool.PoolAcquireContext):
    """`pool.acquire()`: marks the connection suspect when the block raised."""

    __slots__ = ()

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is not None and self.connection is not None:
            # The proxy's connection; None when a loss already took it from its holder (then
            # nothing goes back to the pool, and the borrower's own error must leave as is).
            held = getattr(self.connection, "_con", None)
            if isinstance(held, _Connection):
                held.suspect()
        await super().__aexit__(*exc)


class _Pool(asyncpg.Pool):
    __slots__ = ()

    def acquire(self, *, timeout: float | None = None) -> Any:
        return _Borrowing(self, timeout)


async def _check_usable(conn: "asyncpg.Connection[asyncpg.Record]") -> None:
    """What a connection needs when it goes back to the pool: nothing, unless its borrower
    raised; then proof that it can still run a query (a bare `SELECT`). A connection whose
    server went away mid-statement is left consuming an error; this raises on it, so the pool
    closes it instead of lending it out. A borrower that saw no exception got its answers, so
    the connection is sound: checking it on every release cost a round trip each, about 20
    per task. The default reset (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL) cleans
    state this code never leaves on a pooled connection: its advisory locks are
    transaction-scoped, and LISTEN and the leader's session lock use connections of their
    own. asyncpg rolls back an unfinished transaction either way. A connection the server
    drops while it sits idle in the pool is not caught here (nor was it by the check): its
    next borrower meets `CONNECTION_LOST`."""
    if isinstance(conn, _Connection) and conn.cleared():
        await conn.execute("SELECT")


@asynccontextmanager
async def open_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    generic_plans: bool = False,
    wait: bool = False,
) -> AsyncIterator[Pool]:
    """A pool whose jsonb columns read and write Python values; closed within 5 s on exit.
    `generic_plans`: every statement keeps one plan per connection (`GENERIC_PLANS`), for a
    service whose statements are all lookups by key (the worker's). `wait`: a database that
    does not take connections yet (restarting, starting up, refusing them) is waited for as
    `ride_out` waits, so that a service started meanwhile comes up with it instead of dying."""
    # Short statements only: JIT compiling one whose estimate crosses jit_above_cost (a
    # scheduler query over a table with many dead rows) took 0.7 s for 7 ms of work. No
    # parallel plans either: the round's aggregate of the users' tasks in flight, estimated
    # from statistics that counted a long history, went parallel and took 8 ms for 1 ms of
    # work, most of it starting the workers.
    settings = {"jit": "off", "max_parallel_workers_per_gather": "0"}
    if generic_plans:
        settings["plan_cache_mode"] = "force_generic_plan"

    async def opened() -> Pool:
        return await _Pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            max_queries=50_000,
            max_inactive_connection_lifetime=300.0,
            init=_init_connection,
            reset=_check_usable,
            loop=None,
            connection_class=_Connection,
            record_class=asyncpg.Record,
            command_timeout=30,
            server_settings=settings,
        )

    pool = await (ride_out(opened, "opening the database pool") if wait else opened())
    try:
        yield pool
    finally:
        try:
            async with asyncio.timeout(5):
                await pool.close()
        except TimeoutError:
            logger.warning("database pool did not close in time; terminating it")
            pool.terminate()


class BegunWith(asyncpg.transaction.Transaction):
    """A transaction whose `BEGIN` carries its first statements, in one message (PostgreSQL's
    simple protocol, no parameters): a round trip fewer than `conn.transaction()` followed by
    them. `status` is the last statement's (asyncpg's `execute`). Otherwise asyncpg's own:
    `async with` commits or rolls back, and `conn.transaction()` inside is a savepoint.

    asyncpg makes no such transaction: this one takes its part of asyncpg's private state
    (the connection's top transaction, its own state), as asyncpg's `start` does;
    `tests/integration/test_begun_with.py` fails if asyncpg stops keeping it."""

    __slots__ = ("_first", "status")

    def __init__(self, conn: Connection, first: str) -> None:
        # the connection itself: a pool's proxy would not take the top transaction's mark
        plain: Any = conn.transaction()
        super().__init__(plain._connection, None, False, False)
        self._first = first
        self.status = ""

    async def start(self) -> None:
        this: Any = self  # asyncpg's private attributes are not in its stubs
        con = this._connection
        con._check_open()
        if this._state is not _STARTING or con._top_xact is not None or con.is_in_transaction():
            raise asyncpg.InterfaceError("a transaction begun with statements cannot be nested")
        con._top_xact = self
        try:
            self.status = await con.execute(f"BEGIN; {self._first}")
        except BaseException:
            # a failed first statement leaves the server's transaction begun and aborted
            this._state = _FAILED
            con._top_xact = None
            if con.is_in_transaction() and not con.is_closed():
                with suppress(Exception):
                    await con.execute("ROLLBACK")
            raise
        this._state = _STARTED


_STARTING: Final = asyncpg.transaction.TransactionState.NEW
_STARTED: Final = asyncpg.transaction.TransactionState.STARTED
_FAILED: Final = asyncpg.transaction.TransactionState.FAILED


async def read(pool: Pool, query: Callable[[Connection], Awaitable[T]]) -> T:
    """`query(conn)` on a pooled connection, once more on a fresh one if the first was dropped
    by the server while it sat in the pool: for reads only (nothing to undo if the first try
    got further than it seemed). The first failure renews every connection of the pool (what
    dropped one, a restart or an operator's pg_terminate_backend, most likely dropped them
    all), so the request's next borrowings succeed too."""
    try:
        async with pool.acquire() as conn:
            return await query(conn)
    except CONNECTION_LOST as exc:
        logger.info("database connection dropped (%s); reading again on a fresh one", exc)
    await pool.expire_connections()
    async with pool.acquire() as conn:
        return await query(conn)


#: A database slower than this to answer `SELECT 1` counts as away (health).
PING_TIMEOUT_S: Final = 2.0


async def health(pool: Pool) -> Check:
    """Whether PostgreSQL answers `SELECT 1` on a pooled connection within `PING_TIMEOUT_S`
    (unavailable if not: for a service that can do nothing without it)."""
    try:
        async with asyncio.timeout(PING_TIMEOUT_S), pool.acquire() as conn:
            await conn.fetchval("SELECT 1")
    except (*UNAVAILABLE, TimeoutError) as exc:
        logger.warning("health: PostgreSQL does not answer: %s", exc or "timed out")
        return Check(False, "reconnecting to PostgreSQL", "unavailable")
    return Check(True, "answers")


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
            "run `python -m shared.store.migrate`"
        )


def jsonb_row(data: Any, timestamps: tuple[str, ...]) -> dict[str, Any]:
    """A row as `to_jsonb(<table>)` wrote it, with its `timestamps` columns (ISO text there)
    made datetimes again, for a `from_record`. Raises KeyError, ValueError or TypeError for
    what no such row would be."""
    row = dict(data)
    for name in timestamps:
        if row[name] is not None:
            row[name] = datetime.fromisoformat(row[name])
    return row
