"""Submission rate limits (a token bucket per api token, in the real Redis) and body size limits.

Every test runs in a Redis namespace of its own; the bucket's refill is tested by moving its
stored clock back, not by sleeping.
"""

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from shared import users_repo
from shared.redis_keys import RedisKeys
from tests.conftest import REDIS_URL
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}
#: Effectively no refill during a test: what is taken from the bucket stays taken.
NO_REFILL = 0.0001


@pytest.fixture
async def redis(namespace: str) -> AsyncIterator[Redis]:
    """A client on the test Redis; the test's namespace is emptied afterwards."""
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    found = [k async for k in client.scan_iter(f"{namespace}:*")]
    if found:
        await client.delete(*found)
    await client.aclose()


def _limited(database_url: str, namespace: str, burst: int, **more: Any) -> Any:
    return running_api(
        database_url,
        namespace=namespace,
        submit_burst=burst,
        submit_rate_per_s=more.pop("rate", NO_REFILL),
        **more,
    )


async def _post_job(api: Api, caller: Caller) -> Any:
    return await api.client.post("/jobs", json={"command": "true"}, headers=caller.headers)


async def test_when_a_token_submits_past_its_burst__it_gets_429_with_retry_after(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=2) as api:
        # when
        answers = [await _post_job(api, api.user) for _ in range(3)]

        # then
        assert [a.status_code for a in answers] == [201, 201, 429]
        refused = answers[-1]
        assert int(refused.headers["Retry-After"]) >= 1
        detail = refused.json()["detail"]
        assert "too many submissions with this token" in detail
        assert "at most 2 at once" in detail
        assert await api.jobs_of(api.user) == 2


async def test_when_inputs_are_appended__they_count_against_the_same_bucket(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=2) as api:
        # given: one submission taken
        job = await api.submit(api.user)
        url = f"/jobs/{job['id']}/inputs"

        # when
        first = await api.client.post(url, json={"inputs": ["a"]}, headers=api.user.headers)
        second = await api.client.post(url, json={"inputs": ["b"]}, headers=api.user.headers)

        # then
        assert (first.status_code, second.status_code) == (201, 429)
        assert "Retry-After" in second.headers
        tasks = await api.pool.fetchval("SELECT count(*) FROM tasks WHERE job_id = $1", job["id"])
        assert tasks == 2


async def test_when_one_token_is_limited__other_tokens_still_submit(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=1) as api:
        # given: the user's first token is spent
        assert (await _post_job(api, api.user)).status_code == 201
        assert (await _post_job(api, api.user)).status_code == 429
        second_token = uuid.uuid4().hex
        async with api.pool.acquire() as conn:
            await users_repo.ensure_user(conn, api.user.user.name, "user", second_token)
        same_user = Caller(api.user.user, {"Authorization": f"Bearer {second_token}"})

        # when / then: per token, not per route or per process
        assert (await _post_job(api, same_user)).status_code == 201
        assert (await _post_job(api, api.other)).status_code == 201


async def test_when_an_operator_submits__no_limit_applies(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=1) as api:
        answers = [await _post_job(api, api.operator) for _ in range(5)]

        assert [a.status_code for a in answers] == [201] * 5
        assert [k async for k in redis.scan_iter(f"{namespace}:*")] == []


async def test_when_reads_are_made__they_do_not_take_from_the_bucket(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=1) as api:
        for _ in range(5):
            assert (await api.client.get("/jobs", headers=api.user.headers)).status_code == 200

        assert (await _post_job(api, api.user)).status_code == 201


async def test_when_time_passes__the_bucket_refills_at_the_rate(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=1, rate=0.5) as api:
        # given: spent, and told to wait about 2 s (1 token at 0.5/s)
        assert (await _post_job(api, api.user)).status_code == 201
        refused = await _post_job(api, api.user)
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "2"

        # when: the bucket's clock is moved 3 s back, as if 3 s had passed
        (key,) = [k async for k in redis.scan_iter(f"{namespace}:vigil:api:submit:*")]
        stamp = float(await redis.hget(key, "ts") or 0)
        await redis.hset(key, "ts", str(stamp - 3))

        # then
        assert (await _post_job(api, api.user)).status_code == 201
        assert (await _post_job(api, api.user)).status_code == 429


async def test_when_the_bucket_is_kept__its_key_is_namespaced_expiring_and_holds_no_token(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _limited(session_database_url, namespace, burst=3, rate=1.0) as api:
        await _post_job(api, api.user)

        keys = [k async for k in redis.scan_iter(f"{namespace}:*")]
        assert len(keys) == 1
        assert keys[0] == RedisKeys(namespace).submit_bucket(keys[0].rsplit(":", 1)[1])
        token = api.user.headers["Authorization"].split()[1]
        assert token not in keys[0]
        assert 0 < await redis.pttl(keys[0]) <= 4000  # burst / rate + 1 s


async def test_when_redis_is_down__submissions_are_allowed_and_a_warning_logged(
    session_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = "redis://127.0.0.1:1/0"
    async with running_api(session_database_url, redis_url=unreachable, submit_burst=1) as api:
        with caplog.at_level(logging.WARNING, logger="services.api.rate_limit"):
            answers = [await _post_job(api, api.user) for _ in range(2)]

        assert [a.status_code for a in answers] == [201, 201]
        assert any("rate limit not checked" in r.getMessage() for r in caplog.records)


# Body size limits (services/api/body_limit.py) on every route that takes a body.


@pytest.fixture
async def api(session_database_url: str, namespace: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url, namespace=namespace) as running:
        yield running


def _oversized(limit: int) -> bytes:
    return b'{"inputs": ["' + b"x" * limit + b'"]}'


async def test_when_appended_inputs_are_over_the_body_limit__the_answer_is_413(api: Api) -> None:
    job = await api.submit(api.user)

    response = await api.client.post(
        f"/jobs/{job['id']}/inputs",
        content=_oversized(api.settings.max_body_bytes),
        headers=api.user.headers | JSON,
    )

    assert response.status_code == 413
    assert "larger than the limit" in response.json()["detail"]
    tasks = await api.pool.fetchval("SELECT count(*) FROM tasks WHERE job_id = $1", job["id"])
    assert tasks == 1


@pytest.mark.parametrize(
    "path",
    ["/jobs/j-x/actions", "/tasks/t-x/actions", "/admin/emergency-stop", "/admin/resume"],
)
async def test_when_any_body_is_over_the_limit__the_answer_is_413_before_anything_else(
    api: Api, path: str
) -> None:
    response = await api.client.post(
        path, content=_oversized(api.settings.max_body_bytes), headers=api.operator.headers | JSON
    )

    assert response.status_code == 413
    assert await api.pool.fetchval("SELECT count(*) FROM emergency_stops") == 0


async def test_when_a_body_is_exactly_at_the_limit__it_is_read(api: Api) -> None:
    body = b'{"command": "true", "name": "n"}'
    padded = body[:-1] + b" " * (api.settings.max_body_bytes - len(body)) + b"}"
    assert len(padded) == api.settings.max_body_bytes

    response = await api.client.post("/jobs", content=padded, headers=api.user.headers | JSON)

    assert response.status_code == 201, response.text


@pytest.mark.parametrize("length", ["abc", "-1", "1e3", " "])
async def test_when_content_length_is_not_a_number__the_answer_is_400(
    api: Api, length: str
) -> None:
    headers = api.user.headers | JSON | {"content-length": length}
    request = api.client.build_request("POST", "/jobs", content=b"{}", headers=headers)

    response = await api.client.send(request)

    assert response.status_code == 400
    assert response.json() == {"detail": "the Content-Length header is not a number"}
