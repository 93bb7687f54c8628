"""The end-to-end fixtures (the four services as processes), for the tests of hostile jobs, and
a second, plain user of the stack."""

import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from shared.store import users_repo
from tests.e2e.conftest import client, e2e_namespace, events, stack
from tests.e2e.stack import Stack

__all__ = ["client", "e2e_namespace", "events", "plain_user", "stack"]


@pytest.fixture
async def plain_user(stack: Stack) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A plain user of the stack: (their id, a client with their token)."""
    token = uuid.uuid4().hex
    conn = await asyncpg.connect(stack.database_url)
    try:
        user = await users_repo.ensure_user(conn, f"plain-{token[:8]}", "user", token)
    finally:
        await conn.close()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as c:
        yield user.id, c
