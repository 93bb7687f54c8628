"""Requests as data and the mapping of answers to results and errors (no network)."""

from typing import Any

import httpx
import pytest

from vigil import calls
from vigil.errors import (
    ApiError,
    BadResponse,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unauthorized,
    Unreachable,
    UsageError,
)

_REQUEST = httpx.Request("GET", "http://api/jobs/j-1")


def _answer(status: int, body: Any = None, text: str | None = None) -> httpx.Response:
    if text is not None:
        return httpx.Response(status, text=text, request=_REQUEST)
    return httpx.Response(status, json=body, request=_REQUEST)


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, Unauthorized), (403, Forbidden), (404, NotFound), (409, Conflict),
     (422, InvalidRequest), (413, InvalidRequest), (400, InvalidRequest), (429, RateLimited),
     (500, ApiError), (503, ApiError)],
)  # fmt: skip
def test_when_the_api_answers_an_error__it_becomes_the_matching_error(
    status: int, error: type[ApiError]
) -> None:
    with pytest.raises(error) as caught:
        calls.result(_answer(status, {"detail": "cannot cancel a job in state completed"}))

    assert type(caught.value) is error
    assert caught.value.status == status
    assert caught.value.message == "cannot cancel a job in state completed"


def test_when_a_422_names_fields__the_message_names_each_without_the_location_kind() -> None:
    detail = [
        {"loc": ["body", "inputs"], "msg": "6 inputs given; at most 5 are accepted", "type": "v"},
        {"loc": ["body", "policy", "max_app_retries"], "msg": "must be >= 0", "type": "v"},
    ]

    with pytest.raises(InvalidRequest) as caught:
        calls.result(_answer(422, {"detail": detail}))

    assert caught.value.message == (
        "inputs: 6 inputs given; at most 5 are accepted; policy.max_app_retries: must be >= 0"
    )
    assert caught.value.detail == detail


def test_when_an_error_answer_is_not_json__its_text_is_the_detail() -> None:
    with pytest.raises(ApiError, match="502: Bad Gateway from the proxy"):
        calls.result(_answer(502, text="Bad Gateway from the proxy"))


def test_when_a_success_is_not_json__it_is_a_bad_response() -> None:
    with pytest.raises(BadResponse, match=r"not JSON.*Vigil API"):
        calls.result(_answer(200, text="<html>hello</html>"))


def test_when_a_success_is_json__its_value_is_the_result() -> None:
    assert calls.result(_answer(200, {"id": "j-1"})) == {"id": "j-1"}
    assert calls.result(httpx.Response(204, request=_REQUEST)) is None


@pytest.mark.parametrize("bad", ["../admin/resume", "J-1", "j-1/tasks", "", "j 1", "-j"])
def test_when_an_id_is_malformed__no_request_is_made_of_it(bad: str) -> None:
    with pytest.raises(UsageError, match="not a valid job id"):
        calls.job(bad)
    with pytest.raises(UsageError, match="not a valid task id"):
        calls.task_action(bad, "recover")


def test_when_calls_are_built__paths_params_and_bodies_follow_the_contract() -> None:
    assert calls.logs_page(
        "j-1", task="t-2", run=None, severity="error", after=7, limit=10
    ).params == [("task", "t-2"), ("severity", "error"), ("after", 7), ("limit", 10)]
    throttle = calls.job_action("j-1", "throttle", {"max_in_flight": 2, "release_per_tick": None})
    assert (throttle.path, throttle.json) == (
        "/jobs/j-1/actions",
        {"action": "throttle", "max_in_flight": 2},
    )
    assert calls.submit({"command": "x"}, "k-1").headers == {"Idempotency-Key": "k-1"}
    assert calls.events(["job.*.*", "log.#", "job.*.*"]).params == [
        ("topic", "job.*.*"),
        ("topic", "log.#"),
    ]
    args = calls.job("j-1").request_args("http://h/base", {"Authorization": "Bearer x"})
    assert args["url"] == "http://h/base/jobs/j-1"
    assert args["headers"] == {"Authorization": "Bearer x"}


def test_when_no_topic_is_given__events_is_refused() -> None:
    with pytest.raises(UsageError, match="at least one topic"):
        calls.events([])


def test_when_the_transport_fails__the_error_names_the_url_and_the_reason() -> None:
    error = calls.unreachable("http://api:1", httpx.ConnectError("[Errno 111] Connection refused"))

    assert isinstance(error, Unreachable)
    assert (
        str(error) == "cannot reach the Vigil API at http://api:1: [Errno 111] Connection refused"
    )
    timeout = calls.unreachable("http://api:1", httpx.ReadTimeout(""))
    assert "no answer in time" in str(timeout)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({"Retry-After": "2"}, 2.0), ({"Retry-After": "soon"}, None), ({}, None)],
)
def test_when_a_submission_is_rate_limited__the_error_says_when_to_retry(
    headers: dict[str, str], expected: float | None
) -> None:
    response = httpx.Response(429, json={"detail": "slow down"}, headers=headers, request=_REQUEST)

    with pytest.raises(RateLimited) as caught:
        calls.result(response)

    assert caught.value.retry_after == expected
    assert calls.retry_after(response) == expected
