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

from shared.messaging.redis_keys import RedisKeys
from shared.store import users_repo
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

        keys = [k async for k in redis.scan_iter(f"{namespace}:*api:submit:*")]
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
    stops = "SELECT count(*) FROM emergency_stops"
    before = await api.pool.fetchval(stops)  # other tests' stops may share the database
    response = await api.client.post(
        path, content=_oversized(api.settings.max_body_bytes), headers=api.operator.headers | JSON
    )

    assert response.status_code == 413
    assert await api.pool.fetchval(stops) == before


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


# -- tasks created per user, whatever the route ------------------------------------------------


def _task_quota(database_url: str, namespace: str, burst: int) -> Any:
    """An api whose users may create `burst` tasks (no refill), any number of requests."""
    return running_api(
        database_url,
        namespace=namespace,
        submit_burst=1000,
        task_burst=burst,
        task_rate_per_s=NO_REFILL,
    )


async def _complete(api: Api, job_id: str) -> None:
    """Given-step: every task of the job completed (a state that allows a duplicate)."""
    await api.pool.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", job_id)


async def _tasks_of(api: Api, caller: Caller) -> int:
    count = await api.pool.fetchval(
        "SELECT count(*) FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE j.owner_id = $1",
        caller.user.id,
    )
    return int(count)


async def test_tasks_created_through_any_route_count_against_one_bucket_per_user(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _task_quota(session_database_url, namespace, burst=5) as api:
        # given: 3 tasks submitted and 2 appended (the bucket of 5 is empty)
        job = await api.submit(api.user, inputs=["a", "b", "c"])
        appended = await api.client.post(
            f"/jobs/{job['id']}/inputs", json={"inputs": ["d", "e"]}, headers=api.user.headers
        )
        assert appended.status_code == 201, appended.text
        [task_id, *_] = appended.json()["task_ids"]
        await _complete(api, job["id"])
        second_token = uuid.uuid4().hex
        async with api.pool.acquire() as conn:
            await users_repo.ensure_user(conn, api.user.user.name, "user", second_token)
        same_user = Caller(api.user.user, {"Authorization": f"Bearer {second_token}"})

        # when: a duplicate, with either of the user's tokens
        answers = [
            await api.client.post(
                f"/tasks/{task_id}/actions", json={"action": "duplicate"}, headers=caller.headers
            )
            for caller in (api.user, same_user)
        ]

        # then
        assert [a.status_code for a in answers] == [429, 429]
        assert int(answers[0].headers["Retry-After"]) >= 1
        detail = answers[0].json()["detail"]
        assert f"too many tasks created by {api.user.user.name}" in detail
        assert "at most 5 at once" in detail and "would create 1" in detail
        assert await _tasks_of(api, api.user) == 5
        assert (await api.submit(api.other, inputs=["x"]))["counts"] == {"new": 1}


async def test_a_request_for_more_tasks_than_a_user_may_ever_create_at_once_is_413(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _task_quota(session_database_url, namespace, burst=3) as api:
        answer = await api.client.post(
            "/jobs", json={"command": "true", "inputs": [1, 2, 3, 4]}, headers=api.user.headers
        )

        assert answer.status_code == 413, answer.text
        assert "split it" in answer.json()["detail"]
        assert await api.jobs_of(api.user) == 0
        assert (await api.submit(api.operator, inputs=[1, 2, 3, 4]))["counts"] == {"new": 4}


async def test_an_activation_over_the_quota_is_refused_and_the_job_stays_configuring(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _task_quota(session_database_url, namespace, burst=3) as api:
        # given: a configuring job of 3 held inputs (nothing created yet), one test run
        job = await api.submit(api.user, configuring=True, inputs=["a", "b", "c"])
        test = await api.client.post(
            f"/jobs/{job['id']}/tests", json={"input_index": 0}, headers=api.user.headers
        )
        assert test.status_code == 201, test.text

        # when
        answer = await api.client.post(
            f"/jobs/{job['id']}/actions", json={"action": "activate"}, headers=api.user.headers
        )

        # then
        assert answer.status_code == 429, answer.text
        assert "would create 3" in answer.json()["detail"]
        state = await api.pool.fetchval("SELECT state FROM jobs WHERE id = $1", job["id"])
        assert state == "configuring"
        assert await _tasks_of(api, api.user) == 1  # the test run


async def test_a_bulk_duplicate_over_the_quota_is_refused_before_anything_is_recorded(
    session_database_url: str, namespace: str, redis: Redis
) -> None:
    async with _task_quota(session_database_url, namespace, burst=3) as api:
        job = await api.submit(api.user, inputs=["a", "b"])
        await _complete(api, job["id"])
        body = {"selector": {"job_ids": [job["id"]]}, "action": "duplicate", "confirm": True}

        dry = await api.client.post(
            "/bulk/actions", json=body | {"dry_run": True}, headers=api.user.headers
        )
        answer = await api.client.post("/bulk/actions", json=body, headers=api.user.headers)

        assert dry.status_code == 200, dry.text
        assert answer.status_code == 429, answer.text
        assert "would create 2" in answer.json()["detail"]
        assert await _tasks_of(api, api.user) == 2
        records = await api.pool.fetchval(
            "SELECT count(*) FROM bulk_actions WHERE NOT dry_run AND actor = $1",
            api.user.user.name,
        )
        assert records == 0
