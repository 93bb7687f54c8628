"""Oversized request bodies against the api served by uvicorn, sent by a plain httpx client.

The in-process client cannot show what the wire does: a server that answers before reading the
body and closes leaves the client with a reset instead of the answer.
"""

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from services.api.body_limit import DRAIN_FACTOR
from tests.integration.served_api import Served, served_api

pytestmark = pytest.mark.integration

LIMIT = 1024 * 1024
JSON = {"content-type": "application/json"}


@pytest.fixture
async def served(session_database_url: str, namespace: str) -> AsyncIterator[Served]:
    async with served_api(session_database_url, namespace, max_body_bytes=LIMIT) as running:
        yield running


def _job_body(size: int) -> bytes:
    """A well-formed job submission of exactly `size` bytes."""
    head, tail = b'{"command": "true", "inputs": ["', b'"]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


async def _chunks(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """The body as a stream of unknown length: httpx sends it chunked."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def _assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert f"limit of {LIMIT} bytes" in detail
    assert "VIGIL_MAX_BODY_BYTES" in detail


@pytest.mark.parametrize("times_over", [1.5, DRAIN_FACTOR - 0.5])
@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
async def test_when_a_body_is_over_the_limit__a_plain_client_reads_413_and_goes_on(
    served: Served, times_over: float, chunked: bool
) -> None:
    body = _job_body(int(LIMIT * times_over))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as client:
        response = await client.post(
            "/jobs", content=_chunks(body) if chunked else body, headers=served.user.headers | JSON
        )

        _assert_refused(response)
        assert "connection" not in response.headers  # the body was read: the connection is kept
        assert (await client.get("/jobs", headers=served.user.headers)).status_code == 200


async def test_when_a_client_awaits_100_continue__the_413_comes_before_any_body(
    served: Served,
) -> None:
    host, port = served.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Authorization: {served.user.headers['Authorization']}\r\n"
        f"Content-Length: {100 * LIMIT}\r\nExpect: 100-continue\r\n\r\n"
    )
    try:
        writer.write(head.encode())
        async with asyncio.timeout(10):
            answer = await reader.read()  # the api answers and closes

        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 413 "), answer[:200]
        _assert_refused(httpx.Response(413, content=body))
    finally:
        writer.close()
