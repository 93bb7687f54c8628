"""Hostile text in names, inputs, outputs, filters and reasons: a clear 422, or stored verbatim
and returned intact as JSON; never a 500, and never in a routing key.
"""

import re
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest

from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration

#: Every routing key the outbox may hold for a job: only server-made words and ids.
_SAFE_KEY: Final = re.compile(r"^((task|job)\.[a-z_]+\.j-[a-z0-9]+|pool\.default)$")

# (text, accepted as a job name?) — names are printable text of 1 to 200 characters.
HOSTILE = [
    pytest.param("<script>alert('x')</script>", True, id="html-script"),
    pytest.param('"><img src=x onerror=alert(1)>', True, id="html-attribute"),
    pytest.param("a.*#b", True, id="routing-key-specials"),
    pytest.param("#", True, id="routing-key-hash"),
    pytest.param("'; DROP TABLE jobs; --", True, id="sql-quote"),
    pytest.param("Robert'); DELETE FROM tasks WHERE ('1'='1", True, id="sql-injection"),
    pytest.param("$(rm -rf /) `id` ${HOME}", True, id="shell-expansions"),
    pytest.param("../../etc/passwd", True, id="path-traversal"),
    pytest.param("\u202egnp.exe", True, id="right-to-left-override"),
    pytest.param("é" * 150, True, id="300-bytes-in-150-characters"),
    pytest.param("x" * 300, False, id="300-characters"),
    pytest.param("a\x00b", False, id="nul"),
    pytest.param("line\nbreak", False, id="newline"),
    pytest.param("\x1b[31mred", False, id="terminal-escape"),
]


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _routing_keys(api: Api, job_id: str) -> list[str]:
    rows = await api.pool.fetch("SELECT routing_key FROM outbox WHERE body->>'job_id' = $1", job_id)
    return [r["routing_key"] for r in rows]


@pytest.mark.parametrize(("text", "accepted"), HOSTILE)
async def test_when_a_job_name_is_hostile__it_is_refused_clearly_or_kept_intact(
    api: Api, text: str, accepted: bool
) -> None:
    response = await api.client.post(
        "/jobs", json={"name": text, "command": "true"}, headers=api.user.headers
    )

    if not accepted:
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["body", "name"]
        assert await api.jobs_of(api.user) == 0
        return
    assert response.status_code == 201, response.text
    assert response.headers["content-type"] == "application/json"
    job_id = response.json()["id"]
    assert response.json()["name"] == text
    read = await api.client.get(f"/jobs/{job_id}", headers=api.user.headers)
    assert read.json()["name"] == text
    assert await api.pool.fetchval("SELECT name FROM jobs WHERE id = $1", job_id) == text
    keys = await _routing_keys(api, job_id)
    assert keys and all(_SAFE_KEY.fullmatch(key) for key in keys), keys


@pytest.mark.parametrize(("text", "accepted"), HOSTILE)
async def test_when_an_input_is_hostile__it_is_stored_verbatim_unless_unstorable(
    api: Api, text: str, accepted: bool
) -> None:
    # Inputs are any JSON text, any length up to 64 KiB: only a NUL cannot be stored.
    storable = "\x00" not in text
    inputs = [text, {"nested": text, text: [text]}]

    response = await api.client.post(
        "/jobs", json={"command": "true", "inputs": inputs}, headers=api.user.headers
    )

    if not storable:
        assert response.status_code == 422, response.text
        assert "NUL" in response.json()["detail"][0]["msg"]
        return
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    tasks = await api.client.get(f"/jobs/{job_id}/tasks", headers=api.user.headers)
    assert [t["input"] for t in tasks.json()] == inputs
    keys = await _routing_keys(api, job_id)
    assert keys and all(_SAFE_KEY.fullmatch(key) for key in keys), keys


@pytest.mark.parametrize(("text", "accepted"), HOSTILE)
async def test_when_a_name_filter_is_hostile__the_listing_answers_without_error(
    api: Api, text: str, accepted: bool
) -> None:
    response = await api.client.get("/jobs", params={"name": text}, headers=api.user.headers)

    if "\x00" in text or "\n" in text or "\x1b" in text:
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["query", "name"]
    elif len(text) > 200:
        assert response.status_code == 422, response.text
    else:
        assert response.status_code == 200, response.text
        assert all(job["name"] == text for job in response.json()["items"])


async def test_when_a_hostile_name_is_listed__it_comes_back_intact_and_matched_exactly(
    api: Api,
) -> None:
    name = "<b>bold</b> ' OR '1'='1"
    await api.submit(api.user, name=name)
    await api.submit(api.user, name="other")

    response = await api.client.get("/jobs", params={"name": name}, headers=api.user.headers)

    assert [job["name"] for job in response.json()["items"]] == [name]


@pytest.mark.parametrize(
    ("outputs", "accepted"),
    [
        (["<script>.txt", "a.*#b", "quote'd.csv", "é" * 100], True),
        (["../escape"], False),
        (["a\x00b"], False),
    ],
    ids=["hostile-but-plain-names", "traversal", "nul"],
)
async def test_when_output_names_are_hostile__plain_file_names_are_kept_the_rest_refused(
    api: Api, outputs: list[str], accepted: bool
) -> None:
    response = await api.client.post(
        "/jobs", json={"command": "true", "outputs": outputs}, headers=api.user.headers
    )

    if accepted:
        assert response.status_code == 201, response.text
        assert response.json()["outputs"] == outputs
    else:
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"][:2] == ["body", "outputs"]


@pytest.mark.parametrize(
    "params",
    [
        {"<script>": "</script>", "a.*#b": "'; --"},
        {"k": "x" * 300, "nested": {"deep": ["<img>", 1.5, None, True]}},
    ],
    ids=["hostile-keys-and-values", "long-and-nested"],
)
async def test_when_params_are_hostile__they_are_refused_by_the_type_or_kept_intact(
    api: Api, params: dict[str, Any]
) -> None:
    # `shell` takes no params model: anything storable is kept as sent.
    response = await api.client.post(
        "/jobs", json={"command": "true", "params": params}, headers=api.user.headers
    )

    assert response.status_code == 201, response.text
    assert response.json()["params"] == params


@pytest.mark.parametrize(
    "path",
    ["/jobs/<script>", "/jobs/a.*", "/jobs/'%20OR%201=1", "/tasks/%23", "/jobs/" + "j" * 300],
)
async def test_when_a_path_id_is_hostile__the_answer_is_422_naming_it(api: Api, path: str) -> None:
    response = await api.client.get(path, headers=api.user.headers)

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == "path"
