"""The api's memory of whom tokens belong to (`services/api/credentials.py`): kept only while
changes are listened for, emptied by every change of a token or a user that could make it
wrong, never past a token's expiry, and never for a lookup that read before a change."""

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from services.api import credentials
from services.api.credentials import Credentials
from shared.store import users_repo
from shared.store.db import Connection, Pool
from tests.integration.waiting import until_someone_blocked

pytestmark = pytest.mark.integration

WAIT_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def _listening(url: str, clock: Clock | None = None) -> AsyncIterator[Credentials]:
    async with credentials.listening(url, clock=clock or Clock()) as known:
        async with asyncio.timeout(WAIT_S):
            while not known.listening:
                await known.changed(known.generation)
        yield known


async def _user(pool: Pool, role: users_repo.Role = "user") -> tuple[str, str]:
    """A new user's (name, token)."""
    name, token = f"u-{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    async with pool.acquire() as conn:
        await users_repo.ensure_user(conn, name, role, token)
    return name, token


async def _revoke(conn: Connection, name: str, token: str) -> None:
    await conn.execute(
        "UPDATE tokens SET revoked_at = now() WHERE token_hash = $1", users_repo.hash_token(token)
    )


async def _disable(conn: Connection, name: str, token: str) -> None:
    await users_repo.disable_user(conn, name)


async def _expire(conn: Connection, name: str, token: str) -> None:
    await conn.execute(
        "UPDATE tokens SET expires_at = now() WHERE token_hash = $1", users_repo.hash_token(token)
    )


async def _delete(conn: Connection, name: str, token: str) -> None:
    await conn.execute("DELETE FROM tokens WHERE token_hash = $1", users_repo.hash_token(token))


async def _demote(conn: Connection, name: str, token: str) -> None:
    await conn.execute("UPDATE users SET role = 'user' WHERE name = $1", name)


async def _promote(conn: Connection, name: str) -> None:
    await conn.execute("UPDATE users SET role = 'operator' WHERE name = $1", name)


Change = Callable[[Connection, str, str], Awaitable[None]]


async def test_a_holder_is_read_once_then_remembered(pool: Pool, session_database_url: str) -> None:
    name, token = await _user(pool)
    async with _listening(session_database_url) as known:
        first = await known.holder(pool, token)
        again = await known.holder(pool, token)
    assert first is not None and first.name == name
    assert again == first
    assert known.hits == 1


@pytest.mark.parametrize("change", [_revoke, _disable, _expire, _delete, _demote])
async def test_a_change_made_elsewhere_empties_the_memory(
    pool: Pool, session_database_url: str, change: Change
) -> None:
    name, token = await _user(pool, "operator")
    async with _listening(session_database_url) as known:
        remembered = await known.holder(pool, token)
        assert remembered is not None and remembered.is_operator
        # when the token or its user changes by hand, not through this api
        before = known.generation
        async with pool.acquire() as conn:
            await change(conn, name, token)
        async with asyncio.timeout(WAIT_S):
            await known.changed(before)
        # then the next request reads what it is now
        now = await known.holder(pool, token)
    assert known.hits == 0
    if change is _demote:
        assert now is not None and not now.is_operator
    else:
        assert now is None


async def test_a_change_of_a_users_share_or_usage_notifies_nobody(pool: Pool) -> None:
    other, _ = await _user(pool)
    barrier = f"barrier_{uuid.uuid4().hex[:8]}"
    heard: list[str] = []
    done = asyncio.Event()

    def hear(_conn: object, _pid: int, channel: str, _payload: object) -> None:
        heard.append(channel)
        if channel == barrier:
            done.set()

    async with pool.acquire() as listening, pool.acquire() as conn:
        await listening.add_listener(credentials.CHANNEL, hear)
        await listening.add_listener(barrier, hear)
        try:
            # when the fair share's columns change, then a role (one connection hears its
            # notifications in commit order: the barrier's, last, comes after all of them)
            await users_repo.set_share(conn, other, 2.0)
            await conn.execute("UPDATE users SET usage = usage + 1 WHERE name = $1", other)
            async with conn.transaction():
                await _promote(conn, other)
                await conn.execute(f"NOTIFY {barrier}")
            async with asyncio.timeout(WAIT_S):
                await done.wait()
        finally:
            await listening.remove_listener(credentials.CHANNEL, hear)
            await listening.remove_listener(barrier, hear)
    # then only the role's change told the apis
    assert heard == [credentials.CHANNEL, barrier]


async def test_nothing_is_remembered_while_not_listening(
    pool: Pool, session_database_url: str
) -> None:
    _, token = await _user(pool)
    known = Credentials()
    assert await known.holder(pool, token) is not None
    assert await known.holder(pool, token) is not None
    assert known.hits == 0


async def test_a_lost_listener_forgets_and_listens_again(
    pool: Pool, session_database_url: str
) -> None:
    _, token = await _user(pool)
    async with _listening(session_database_url) as known:
        await known.holder(pool, token)
        # when the listening connection is cut
        before = known.generation
        async with pool.acquire() as conn:
            cut = await conn.fetchval(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN %vigil_credentials%'"
                " AND datname = current_database()"
            )
        assert cut
        async with asyncio.timeout(WAIT_S):
            await known.changed(before)
            # then what was remembered is gone, and nothing is kept until it listens again
            while not known.listening:
                assert await known.holder(pool, token) is not None
                await known.changed(known.generation)
        hits = known.hits
        await known.holder(pool, token)
        await known.holder(pool, token)
    assert hits == 0
    assert known.hits == 1


async def test_a_lookup_that_read_before_a_change_is_not_kept(
    pool: Pool, session_database_url: str
) -> None:
    _, token = await _user(pool)
    other, _ = await _user(pool)
    async with _listening(session_database_url) as known, pool.acquire() as locking:
        # given a lookup held up by a lock on the tokens
        lock = locking.transaction()
        await lock.start()
        await locking.execute("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
        lookup = asyncio.create_task(known.holder(pool, token))
        await until_someone_blocked(pool, running="%FROM tokens t JOIN users u%")
        # when a change is notified meanwhile
        before = known.generation
        async with pool.acquire() as conn:
            await _promote(conn, other)
        async with asyncio.timeout(WAIT_S):
            await known.changed(before)
        await lock.rollback()
        # then the lookup answers, but is not kept
        assert await lookup is not None
        await known.holder(pool, token)
    assert known.hits == 0


async def test_a_token_is_remembered_no_longer_than_it_is_valid(
    pool: Pool, session_database_url: str
) -> None:
    _, token = await _user(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE tokens SET expires_at = now() + interval '2 seconds' WHERE token_hash = $1",
            users_repo.hash_token(token),
        )
    clock = Clock()
    async with _listening(session_database_url, clock) as known:
        await known.holder(pool, token)
        clock.now += 1.0
        await known.holder(pool, token)  # remembered
        clock.now += 1.5  # past the token's expiry, within REMEMBER_S
        await known.holder(pool, token)  # read again
    assert known.hits == 1


async def test_a_refusal_is_not_remembered(pool: Pool, session_database_url: str) -> None:
    token = uuid.uuid4().hex
    async with _listening(session_database_url) as known:
        assert await known.holder(pool, token) is None
        async with pool.acquire() as conn:
            await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:10]}", "user", token)
        assert await known.holder(pool, token) is not None


async def test_a_database_it_cannot_listen_on_leaves_it_reading(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    _, token = await _user(pool)
    # a server that refuses the listening connection (a database that does not exist)
    missing = f"postgresql://postgres@127.0.0.1/no_such_{uuid.uuid4().hex[:8]}"
    async with credentials.listening(missing) as known:
        async with asyncio.timeout(WAIT_S):
            while "cannot listen for token changes yet" not in caplog.text:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert not known.listening
        assert await known.holder(pool, token) is not None
        assert await known.holder(pool, token) is not None
    assert known.hits == 0
