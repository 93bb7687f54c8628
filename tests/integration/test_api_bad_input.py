"""Bad input never gets a 500 and never writes anything: a 4xx whose message names the problem."""

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.api.body_limit import DRAIN_FACTOR
from shared.task_types.registry import load_task_types
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url, max_inputs=5, max_body_bytes=200_000) as running:
        yield running


def assert_names(response: Any, loc: list[Any], words: str) -> None:
    """A 422 with an error at `loc` whose message contains `words`."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    matching = [e for e in detail if e["loc"] == loc]
    assert matching, f"no error at {loc}: {detail}"
    assert any(words in e["msg"] for e in matching), detail


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _cursor(stamp: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([stamp, "j-x"]).encode()).decode()


BAD_BODIES = [
    pytest.param(
        {"command": "x", "colour": "red"}, ["body", "colour"], "Extra inputs", id="unknown-field"
    ),
    pytest.param({"command": ""}, ["body", "command"], "must not be blank", id="empty-command"),
    pytest.param(
        {"command": " \n\t"}, ["body", "command"], "must not be blank", id="blank-command"
    ),
    pytest.param({}, ["body", "command"], "command is required", id="no-command"),
    pytest.param({"command": "a\x00b"}, ["body", "command"], "NUL", id="nul-in-command"),
    pytest.param(
        {"command": "x" * 65_537}, ["body", "command"], "at most 65536", id="long-command"
    ),
    pytest.param(
        {"command": "x", "inputs": list(range(6))},
        ["body", "inputs"],
        "at most 5",
        id="too-many-inputs",
    ),
    pytest.param({"command": "x", "inputs": []}, ["body", "inputs"], "at least 1", id="no-inputs"),
    pytest.param(
        {"command": "x", "inputs": ["y" * 65_540]},
        ["body", "inputs", 0],
        "the limit is 65536",
        id="input-too-large",
    ),
    pytest.param(
        {"command": "x", "inputs": [{"a": "\x00"}]}, ["body", "inputs", 0], "NUL", id="nul-in-input"
    ),
    pytest.param(
        {"command": "x", "type": "nope"},
        ["body", "type"],
        "unknown task type 'nope'; known types:",
        id="unknown-type",
    ),
    pytest.param(
        {"type": "diagnostics", "params": {"setup_delay": -1}},
        ["body", "params", "setup_delay"],
        "greater than or equal to 0 (for diagnostics)",
        id="params-out-of-range-for-the-type",
    ),
    pytest.param(
        {"type": "diagnostics", "params": {"sleep": 1}},
        ["body", "params", "sleep"],
        "Extra inputs are not permitted (for diagnostics)",
        id="params-unknown-to-the-type",
    ),
    pytest.param(
        {"command": "x", "type": "Bad Type"}, ["body", "type"], "pattern", id="malformed-type"
    ),
    pytest.param({"command": "x", "name": ""}, ["body", "name"], "at least 1", id="empty-name"),
    pytest.param(
        {"command": "x", "name": "n" * 201}, ["body", "name"], "at most 200", id="long-name"
    ),
    pytest.param(
        {"command": "x", "outputs": ["a/b"]},
        ["body", "outputs", 0],
        "plain file name",
        id="output-with-slash",
    ),
    pytest.param(
        {"command": "x", "outputs": [".."]},
        ["body", "outputs", 0],
        "plain file name",
        id="output-dotdot",
    ),
    pytest.param(
        {"command": "x", "outputs": [""]},
        ["body", "outputs", 0],
        "plain file name",
        id="output-empty",
    ),
    pytest.param(
        {"command": "x", "outputs": ["o" * 256]},
        ["body", "outputs", 0],
        "plain file name",
        id="output-too-long",
    ),
    pytest.param(
        {"command": "x", "outputs": ["line\nbreak"]},
        ["body", "outputs", 0],
        "no control characters",
        id="output-with-newline",
    ),
    pytest.param(
        {"command": "x", "outputs": ["r", "r"]},
        ["body", "outputs"],
        "listed twice",
        id="output-twice",
    ),
    pytest.param(
        {"command": "x", "params": {"k": _nested(40)}},
        ["body", "params", "k"],
        "nested deeper",
        id="param-too-deep",
    ),
    pytest.param(
        {"command": "x", "policy": {"max_infra_retries": -1}},
        ["body", "policy", "max_infra_retries"],
        "greater than or equal to 0",
        id="policy-out-of-range",
    ),
    pytest.param(
        {"command": "x", "policy": {"retries": 2}},
        ["body", "policy", "retries"],
        "Extra inputs",
        id="policy-unknown-field",
    ),
    pytest.param(
        {"command": "x", "prerequisites": {"setup": {"t-missing": "completed"}}},
        ["body", "prerequisites", "setup", "t-missing"],
        "prerequisite task 't-missing' does not exist",
        id="prerequisite-missing-task",
    ),
    pytest.param(
        {"command": "x", "prerequisites": {"setup": {"t-x": "done"}}},
        ["body", "prerequisites", "setup", "t-x"],
        "'completed' or 'failed'",
        id="prerequisite-bad-state",
    ),
    pytest.param(
        {"command": "x", "prerequisites": {"setup": {"T.X": "failed"}}},
        ["body", "prerequisites", "setup", "T.X", "[key]"],
        "task id 'T.X' is not a valid id",
        id="prerequisite-bad-id",
    ),
    pytest.param(
        {"command": "x", "prerequisites": {"cluster": {}}},
        ["body", "prerequisites", "cluster"],
        "Extra inputs",
        id="prerequisite-bad-stage",
    ),
    pytest.param(
        {"command": "x", "inputs_from": "j-missing"},
        ["body", "inputs_from"],
        "job 'j-missing' named in inputs_from does not exist",
        id="inputs-from-missing",
    ),
    pytest.param(
        {"command": "x", "inputs_from": "J#1"},
        ["body", "inputs_from"],
        "job id 'J#1' is not a valid id",
        id="inputs-from-bad-id",
    ),
]


@pytest.mark.parametrize(("body", "loc", "words"), BAD_BODIES)
async def test_when_the_body_is_invalid__the_answer_is_422_naming_the_field_and_no_job_is_made(
    api: Api, body: dict[str, Any], loc: list[Any], words: str
) -> None:
    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    assert_names(response, loc, words)
    assert await api.jobs_of(api.user) == 0


async def test_when_the_analyser_is_unknown__the_answer_names_the_installed_ones(api: Api) -> None:
    body = {"command": "x", "policy": {"analyser": "nope"}}
    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    assert_names(response, ["body", "policy", "analyser"], "unknown analyser 'nope'")
    assert "default" in response.text
    assert await api.jobs_of(api.user) == 0


async def test_when_the_type_is_unknown__the_answer_names_every_installed_type(api: Api) -> None:
    response = await api.client.post(
        "/jobs", json={"command": "x", "type": "nope"}, headers=api.user.headers
    )

    (error,) = response.json()["detail"]
    for name in load_task_types():
        assert name in error["msg"]


async def test_when_the_prerequisite_is_another_users_task__it_is_reported_missing(
    api: Api,
) -> None:
    # given
    theirs = await api.submit(api.other)
    tasks = await api.client.get(f"/jobs/{theirs['id']}/tasks", headers=api.other.headers)
    task_id = tasks.json()[0]["id"]

    # when
    body = {"command": "x", "prerequisites": {"post_processing": {task_id: "completed"}}}
    response = await api.client.post("/jobs", json=body, headers=api.user.headers)

    # then
    loc = ["body", "prerequisites", "post_processing", task_id]
    assert_names(response, loc, f"prerequisite task {task_id!r} does not exist")
    assert await api.jobs_of(api.user) == 0


@pytest.mark.parametrize(
    ("content", "loc", "words"),
    [
        (b'{"command": ', ["body", 12], "not valid JSON"),
        (b'{"command": "x",}', ["body", 16], "not valid JSON"),
        (b'{"command": "\xff"}', ["body"], "not UTF-8"),
        (b"[" * 100_000, ["body"], "not valid JSON"),
        (b'{"command": "x", "inputs": [NaN]}', ["body", "inputs", 0], "not finite"),
        (b'{"command": "x", "inputs": ["\\ud800"]}', ["body", "inputs", 0], "lone surrogate"),
        (b'["not", "an", "object"]', ["body"], "must be a JSON object"),
        (b'{"command": "x", "inputs": [' + b"9" * 5000 + b"]}", ["body"], "digits"),
    ],
    ids=[
        "truncated",
        "trailing-comma",
        "not-utf8",
        "too-deep",
        "nan",
        "surrogate",
        "array",
        "huge-number",
    ],
)
async def test_when_the_body_is_not_acceptable_json__the_answer_is_422_and_no_job_is_made(
    api: Api, content: bytes, loc: list[Any], words: str
) -> None:
    response = await api.client.post("/jobs", content=content, headers=api.user.headers | JSON)

    assert_names(response, loc, words)
    assert await api.jobs_of(api.user) == 0


async def test_when_the_body_is_sent_without_a_json_content_type__the_answer_says_so(
    api: Api,
) -> None:
    response = await api.client.post("/jobs", content=b'{"command": "x"}', headers=api.user.headers)

    assert_names(response, ["body"], "Content-Type: application/json")
    assert await api.jobs_of(api.user) == 0


async def test_when_the_body_declares_a_length_over_the_limit__the_answer_is_413(api: Api) -> None:
    body = b'{"command": "' + b"x" * 200_000 + b'"}'

    response = await api.client.post("/jobs", content=body, headers=api.user.headers | JSON)

    assert response.status_code == 413
    assert response.json() == {
        "detail": "request body is larger than the limit of 200000 bytes"
        " (the api's VIGIL_MAX_BODY_BYTES setting)"
    }
    assert await api.jobs_of(api.user) == 0


async def test_when_a_chunked_body_grows_over_the_limit__the_answer_is_413(api: Api) -> None:
    # given
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"command": "'
        for _ in range(100):
            sent += 10_000
            yield b"x" * 10_000
        yield b'"}'

    # when
    response = await api.client.post("/jobs", content=chunks(), headers=api.user.headers | JSON)

    # then
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert "larger than the limit of 200000 bytes" in response.json()["detail"]
    assert sent <= DRAIN_FACTOR * 200_000 + 10_000  # reading stopped at the bound of discarding
    assert await api.jobs_of(api.user) == 0


async def test_when_a_chunked_body_is_under_the_limit__the_job_is_made(api: Api) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"command": '
        yield b'"true"}'

    response = await api.client.post("/jobs", content=chunks(), headers=api.user.headers | JSON)

    assert response.status_code == 201, response.text
    assert await api.jobs_of(api.user) == 1


@pytest.mark.parametrize(
    ("key", "words"),
    [("k" * 201, "1 to 200 printable"), ("tab\tkey", "printable ASCII"), ("", "1 to 200")],
    ids=["too-long", "control-character", "empty"],
)
async def test_when_the_idempotency_key_is_invalid__the_answer_is_422_naming_the_header(
    api: Api, key: str, words: str
) -> None:
    headers = api.user.headers | {"Idempotency-Key": key}

    response = await api.client.post("/jobs", json={"command": "x"}, headers=headers)

    assert_names(response, ["header", "Idempotency-Key"], words)
    assert await api.jobs_of(api.user) == 0


@pytest.mark.parametrize(
    ("path", "loc", "words"),
    [
        ("/jobs/J.1", ["path", "job_id"], "job id 'J.1' is not a valid id"),
        ("/jobs/-x/tasks", ["path", "job_id"], "job id '-x' is not a valid id"),
        ("/jobs/a*b/logs", ["path", "job_id"], "job id 'a*b' is not a valid id"),
        ("/tasks/t%23x", ["path", "task_id"], "task id 't#x' is not a valid id"),
        (f"/tasks/{'t' * 64}", ["path", "task_id"], "is not a valid id"),
    ],
)
async def test_when_a_path_id_is_malformed__the_answer_is_422_naming_it(
    api: Api, path: str, loc: list[str], words: str
) -> None:
    response = await api.client.get(path, headers=api.user.headers)

    assert_names(response, loc, words)


@pytest.mark.parametrize(
    ("path", "params", "loc", "words"),
    [
        ("/jobs", {"state": "running"}, ["query", "state"], "'active'"),
        ("/jobs", {"limit": 0}, ["query", "limit"], "greater than or equal to 1"),
        ("/jobs", {"limit": 501}, ["query", "limit"], "less than or equal to 500"),
        ("/jobs", {"cursor": "bm90LWpzb24"}, ["query", "cursor"], "is malformed"),
        ("/jobs", {"cursor": "!!!"}, ["query", "cursor"], "is malformed"),
        (
            "/jobs",
            {"cursor": _cursor("9999-12-31T23:59:59-14:00")},
            ["query", "cursor"],
            "is malformed",
        ),
        ("/jobs", {"cursor": _cursor("2024-01-01T00:00:00")}, ["query", "cursor"], "is malformed"),
        ("/jobs", {"name": "a\x00b"}, ["query", "name"], "pattern"),
        ("/jobs/j-x/logs", {"severity": "loud"}, ["query", "severity"], "'fatal'"),
        ("/jobs/j-x/logs", {"run": 0}, ["query", "run"], "greater than or equal to 1"),
        ("/jobs/j-x/logs", {"run": 2**40}, ["query", "run"], "less than or equal to"),
        ("/jobs/j-x/logs", {"after": -1}, ["query", "after"], "greater than or equal to 0"),
        ("/jobs/j-x/logs", {"limit": 10_001}, ["query", "limit"], "less than or equal to 10000"),
        ("/jobs/j-x/logs", {"task": "T.1"}, ["query", "task"], "pattern"),
    ],
)
async def test_when_a_query_parameter_is_invalid__the_answer_is_422_naming_it(
    api: Api, path: str, params: dict[str, Any], loc: list[str], words: str
) -> None:
    response = await api.client.get(path, params=params, headers=api.user.headers)

    assert_names(response, loc, words)
