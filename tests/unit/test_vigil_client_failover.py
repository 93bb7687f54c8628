"""Several apis (`VIGIL_URL=http://a,http://b`): a request that got no answer goes to the next
api when sending it again cannot do anything twice (`vigil.endpoints`)."""

import httpx
import pytest

from vigil import AsyncClient, Client, Unreachable
from vigil.config import check_urls
from vigil.errors import ConfigError


class Apis:
    """Api `a` fails with `error` (before or after the request left); api `b` answers."""

    def __init__(self, error: type[httpx.TransportError]) -> None:
        self.error = error
        self.seen: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.host}")
        if request.url.host == "a":
            raise self.error("down", request=request)
        return httpx.Response(201 if request.method == "POST" else 200, json={"id": "j-1"})


def _client(apis: Apis) -> Client:
    return Client("http://a,http://b/", "t", http=httpx.Client(transport=httpx.MockTransport(apis)))


def test_a_request_that_reached_no_api_goes_to_the_next_which_then_keeps_the_requests() -> None:
    apis = Apis(httpx.ConnectError)
    client = _client(apis)

    assert client.submit({"command": "true"})["id"] == "j-1"
    assert client.job("j-1")["id"] == "j-1"
    assert apis.seen == ["POST a", "POST b", "GET b"]
    assert client.url == "http://b"


def test_a_submission_that_may_have_arrived_is_not_sent_again_without_a_key() -> None:
    apis = Apis(httpx.ReadError)
    with pytest.raises(Unreachable, match="http://a"):
        _client(apis).submit({"command": "true"})
    assert apis.seen == ["POST a"]


def test_with_an_idempotency_key_or_for_a_read_it_is() -> None:
    apis = Apis(httpx.ReadError)
    client = _client(apis)
    assert client.submit({"command": "true"}, idempotency_key="k-1")["id"] == "j-1"
    assert apis.seen == ["POST a", "POST b"]

    apis = Apis(httpx.ReadTimeout)
    assert _client(apis).job("j-1")["id"] == "j-1"
    assert apis.seen == ["GET a", "GET b"]


def test_when_no_api_answers_the_last_one_tried_is_named() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = Client("http://a,http://b", http=httpx.Client(transport=httpx.MockTransport(down)))
    with pytest.raises(Unreachable, match="http://b"):
        client.job("j-1")


async def test_the_async_client_goes_to_the_next_api_too() -> None:
    apis = Apis(httpx.ConnectError)
    async with httpx.AsyncClient(transport=httpx.MockTransport(apis)) as http:
        client = AsyncClient("http://a,http://b", "t", http=http)
        assert (await client.job("j-1"))["id"] == "j-1"
    assert apis.seen == ["GET a", "GET b"]


def test_the_urls_are_checked_one_by_one() -> None:
    assert check_urls(" http://a:8000/ , https://b ") == ("http://a:8000", "https://b")
    with pytest.raises(ConfigError, match="'ftp://b'"):
        check_urls("http://a,ftp://b")
    with pytest.raises(ConfigError, match="names no address"):
        check_urls(" , ")
