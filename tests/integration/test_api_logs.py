"""`GET /jobs/{id}/logs`: stored lines come back in order, filtered, and resumable by `after`."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.domain.messages import LogRecord, Severity
from shared.store import logs_repo
from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Logged:
    """A job with two tasks and the lines stored for them, in insertion order."""

    job_id: str
    tasks: list[str]
    lines: list[LogRecord]


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


@pytest.fixture
async def logged(api: Api) -> Logged:
    job = await api.submit(api.user, inputs=["a", "b"])
    tasks = await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)
    first, second = (t["id"] for t in tasks.json())
    plan: list[tuple[str, int, Severity, str]] = [
        (first, 1, Severity.INFO, "starting"),
        (second, 1, Severity.INFO, "starting too"),
        (first, 1, Severity.WARNING, "disk is slow"),
        (first, 2, Severity.ERROR, "ERROR: it broke"),
        (second, 1, Severity.INFO, "done"),
    ]
    lines = [
        LogRecord(
            job_id=job["id"],
            task_id=task_id,
            run_number=run,
            attempt=run,
            line_no=number,
            severity=severity,
            stream="stderr" if severity is Severity.WARNING else "stdout",
            line=text,
        )
        for number, (task_id, run, severity, text) in enumerate(plan)
    ]
    async with api.pool.acquire() as conn:
        await logs_repo.insert(conn, lines)
    return Logged(job["id"], [first, second], lines)


async def _logs(api: Api, job_id: str, **params: Any) -> dict[str, Any]:
    response = await api.client.get(f"/jobs/{job_id}/logs", params=params, headers=api.user.headers)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


async def test_when_reading_a_jobs_logs__every_line_comes_in_order_with_its_fields(
    api: Api, logged: Logged
) -> None:
    page = await _logs(api, logged.job_id)

    items = page["items"]
    assert [i["line"] for i in items] == [r.line for r in logged.lines]
    seqs = [i["seq"] for i in items]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert page["next_after"] == seqs[-1]
    first = items[0]
    assert (first["task_id"], first["run_number"], first["severity"], first["stream"]) == (
        logged.tasks[0],
        1,
        "info",
        "stdout",
    )
    assert first["ts"].endswith("Z") or "+" in first["ts"]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"task": 1}, ["starting too", "done"]),
        ({"run": 2}, ["ERROR: it broke"]),
        ({"severity": "warning"}, ["disk is slow"]),
        ({"task": 0, "run": 1}, ["starting", "disk is slow"]),
        ({"limit": 2}, ["starting", "starting too"]),
    ],
    ids=["task", "run", "severity", "task-and-run", "limit"],
)
async def test_when_filtering_logs__only_matching_lines_come(
    api: Api, logged: Logged, filters: dict[str, Any], expected: list[str]
) -> None:
    if "task" in filters:
        filters = filters | {"task": logged.tasks[filters["task"]]}

    page = await _logs(api, logged.job_id, **filters)

    assert [i["line"] for i in page["items"]] == expected


async def test_when_reading_after_a_sequence_number__only_later_lines_come(
    api: Api, logged: Logged
) -> None:
    # given
    first_page = await _logs(api, logged.job_id, limit=2)

    # when
    rest = await _logs(api, logged.job_id, after=first_page["next_after"])
    nothing_new = await _logs(api, logged.job_id, after=rest["next_after"])

    # then
    assert [i["line"] for i in rest["items"]] == [r.line for r in logged.lines[2:]]
    assert nothing_new == {"items": [], "next_after": None}


async def test_when_a_job_has_no_logs__the_page_is_empty(api: Api) -> None:
    job = await api.submit(api.user)

    assert await _logs(api, job["id"]) == {"items": [], "next_after": None}


async def test_a_tail_is_the_last_lines_in_order_of_the_job_or_of_one_task_and_run(
    api: Api, logged: Logged
) -> None:
    path = f"/jobs/{logged.job_id}/logs"
    first = logged.tasks[0]

    job_tail = await api.client.get(path, params={"tail": 2}, headers=api.user.headers)
    task_tail = await api.client.get(
        path, params={"tail": 5, "task": first, "run": 1}, headers=api.user.headers
    )
    mixed = await api.client.get(path, params={"tail": 2, "after": 1}, headers=api.user.headers)

    assert [i["line"] for i in job_tail.json()["items"]] == ["ERROR: it broke", "done"]
    assert [i["line"] for i in task_tail.json()["items"]] == ["starting", "disk is slow"]
    assert mixed.status_code == 422 and "tail" in mixed.text
