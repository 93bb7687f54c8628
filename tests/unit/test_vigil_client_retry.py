"""A submission refused with 429 is sent again after `Retry-After`, a bounded number of times."""

import httpx
import pytest

from vigil import AsyncClient, Client, RateLimited


class Limited:
    """Answers 429 (`Retry-After: 0`) `refusals` times, then 201 with a job."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.refusals:
            return httpx.Response(429, json={"detail": "slow down"}, headers={"Retry-After": "0"})
        return httpx.Response(201, json={"id": "j-1", "state": "active"})


def test_when_rate_limited_a_few_times__the_submission_goes_through() -> None:
    fake = Limited(refusals=2)
    client = Client("http://api", "t", http=httpx.Client(transport=httpx.MockTransport(fake)))

    assert client.submit({"command": "true"})["id"] == "j-1"
    assert fake.calls == 3


def test_when_rate_limited_more_than_the_retries__rate_limited_is_raised() -> None:
    fake = Limited(refusals=5)
    http = httpx.Client(transport=httpx.MockTransport(fake))
    client = Client("http://api", "t", http=http, rate_limit_retries=1)

    with pytest.raises(RateLimited, match="slow down"):
        client.submit({"command": "true"})
    assert fake.calls == 2


async def test_when_rate_limited_asynchronously__the_submission_goes_through() -> None:
    fake = Limited(refusals=1)
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake)) as http:
        client = AsyncClient("http://api", "t", http=http)

        assert (await client.submit({"command": "true"}))["id"] == "j-1"
    assert fake.calls == 2
