"""Following events and dispatching them to callbacks, against a stand-in for `GET /events`.

The API's SSE route is served here by an `httpx.MockTransport` speaking the agreed format
(`data: {"routing_key", "body"}` messages and `: keepalive` comments), so the client's side of
it is tested on its own; tests/integration and tests/e2e cover the real route.
"""

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from vigil import AsyncClient, Client, Event, Unauthorized, Unreachable

KEYS = [
    "task.failed_on_cluster.j-1",
    "task.completed.j-1",
    "job.failed.j-1",
    "task.failed_on_cluster.j-2",
]


def _stream(keys: list[str]) -> bytes:
    parts = [": keepalive\n\n"]
    for n, key in enumerate(keys):
        payload = {"routing_key": key, "body": {"n": n}}
        parts.append(f"data: {json.dumps(payload)}\n\n: keepalive\n\n")
    return "".join(parts).encode()


class FakeEvents:
    """Serves each `GET /events` with the next canned body; records the requests."""

    def __init__(self, *bodies: bytes, status: int = 200) -> None:
        self.bodies = list(bodies)
        self.status = status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status != 200:
            return httpx.Response(self.status, json={"detail": "missing or invalid bearer token"})
        if not self.bodies:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=self.bodies.pop(0), headers=headers)


def _client(fake: Callable[[httpx.Request], httpx.Response]) -> Client:
    http = httpx.Client(transport=httpx.MockTransport(fake))
    return Client("http://api", "tok-1", http=http)


def test_when_listening__each_callback_gets_only_the_events_its_pattern_matches() -> None:
    fake = FakeEvents(_stream(KEYS))
    client = _client(fake)
    failed: list[Event] = []
    everything: list[str] = []
    client.on("task.failed_on_cluster.*", failed.append)
    client.on("#", lambda event: everything.append(event.routing_key))

    client.listen(reconnect=False)

    assert [(e.routing_key, e.body) for e in failed] == [
        ("task.failed_on_cluster.j-1", {"n": 0}),
        ("task.failed_on_cluster.j-2", {"n": 3}),
    ]
    assert everything == KEYS
    (request,) = fake.requests
    assert request.url.path == "/events"
    assert request.url.params.get_list("topic") == ["task.failed_on_cluster.*", "#"]
    assert request.headers["Authorization"] == "Bearer tok-1"


def test_when_the_stream_ends__listen_reconnects_until_a_callback_stops_it() -> None:
    fake = FakeEvents(_stream(KEYS[:1]), _stream(KEYS[1:]))
    client = _client(fake)
    seen: list[str] = []

    @client.on("#")
    def collect(event: Event) -> None:
        seen.append(event.routing_key)
        if len(seen) == 3:
            client.stop_listening()

    client.listen(retry_s=0.01)

    assert seen == KEYS[:3]
    assert len(fake.requests) == 2


def test_when_the_api_is_gone_and_reconnect_is_off__unreachable_is_raised() -> None:
    client = _client(FakeEvents())
    client.on("#", lambda event: None)

    with pytest.raises(Unreachable, match="cannot reach the Vigil API at http://api"):
        client.listen(reconnect=False)


def test_when_the_api_refuses_the_token__listen_stops_with_unauthorized() -> None:
    client = _client(FakeEvents(status=401))
    client.on("#", lambda event: None)

    with pytest.raises(Unauthorized):
        client.listen()


def test_when_events_is_iterated__it_yields_every_event_then_ends() -> None:
    client = _client(FakeEvents(_stream(KEYS)))

    assert [e.routing_key for e in client.events(["#"])] == KEYS


async def test_when_listening_asynchronously__async_and_plain_callbacks_both_run() -> None:
    fake = FakeEvents(_stream(KEYS))
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    client = AsyncClient("http://api", "tok-1", http=http)
    seen: list[tuple[str, Any]] = []

    async def on_failure(event: Event) -> None:
        seen.append(("async", event.routing_key))

    client.on("task.failed_on_cluster.*", on_failure)
    client.on("job.*.*", lambda event: seen.append(("plain", event.routing_key)))

    await client.listen(reconnect=False)
    await http.aclose()

    assert seen == [
        ("async", "task.failed_on_cluster.j-1"),
        ("plain", "job.failed.j-1"),
        ("async", "task.failed_on_cluster.j-2"),
    ]


def test_when_following_with_on_open__it_is_called_once_per_opened_stream() -> None:
    client = _client(FakeEvents(_stream(KEYS[:1]), _stream(KEYS[1:2])))
    log: list[str] = []

    for event in client.follow(["#"], retry_s=0.01, on_open=lambda: log.append("open")):
        log.append(event.routing_key)
        if len(log) == 4:
            break

    assert log == ["open", KEYS[0], "open", KEYS[1]]
