"""The dashboard's task page, server side: the attempts as a timeline, the
status file, the outputs with download links, one run's log (the current one live, earlier ones
a click away), error details for operators only, and another user's task not found.

The browser side (live lines, search) is in `tests/e2e/test_dashboard.py`.
"""

import html
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.api import dashboard
from shared.domain.states import FailureClass
from shared.store import attempts_repo, outputs_repo
from shared.store.attempts_repo import Attempt
from shared.task_types.base import OutputRecord
from tests.integration.test_api_harness import Api, running_api
from tests.integration.test_api_pages import HOSTILE, _cookie, _page_data

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _task_with_history(api: Api) -> tuple[str, str]:
    """Given-step: a task of the user's whose first run failed on the cluster (with a status
    file and a traceback), recovered into a second run that completed with an output; one log
    line in each run. Returns (job id, task id)."""
    job = await api.submit(api.user, inputs=["a"])
    task_id = await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", job["id"])
    async with api.pool.acquire() as conn:
        claim = uuid.uuid4()
        await conn.execute("UPDATE tasks SET claim = $2 WHERE id = $1", task_id, claim)
        first = await attempts_repo.start(conn, task_id, claim, "cluster", host="h1", worker="w1")
        await attempts_repo.finish(
            conn,
            task_id,
            first.attempt,
            "failed_on_cluster",
            exit_code=3,
            failure_class=FailureClass.EXIT,
            error_brief="command exited with code 3",
            error_detail="Traceback: /srv/secret/path.py",
            status={"status": "recoverable", "message": HOSTILE},
        )
        await conn.execute(
            "UPDATE tasks SET run_number = 2, state = 'completed', failure_class = 'exit',"
            " error_brief = 'command exited with code 3', error_detail = 'Traceback: /srv/x'"
            " WHERE id = $1",
            task_id,
        )
        second = await attempts_repo.start(conn, task_id, claim, "cluster", host="h2", worker="w2")
        await attempts_repo.finish(conn, task_id, second.attempt, "completed", exit_code=0)
        await outputs_repo.save(
            conn, task_id, 2, "h2", [OutputRecord("result.txt", "/w/result.txt", 5, "ab", b"hello")]
        )
        for run, attempt, line in ((1, first, "first run's line"), (2, second, HOSTILE)):
            await conn.execute(
                "INSERT INTO logs (job_id, task_id, run_number, attempt, line_no, ts, severity,"
                " stream, line) VALUES ($1, $2, $3, $4, 1, now(), 'warning', 'stdout', $5)",
                job["id"],
                task_id,
                run,
                attempt.attempt,
                line,
            )
    return job["id"], task_id


async def test_the_task_page_shows_its_attempts_status_outputs_and_the_current_runs_log(
    api: Api,
) -> None:
    job_id, task_id = await _task_with_history(api)

    page = await api.client.get(f"/ui/tasks/{task_id}", headers=_cookie(api.user))

    assert page.status_code == 200, page.text
    text = page.text
    assert len(re.findall(r"<tr data-attempt=", text)) == 2
    assert re.findall(r'<tr data-attempt="\d+" data-outcome="([a-z_]*)"', text) == [
        "failed_on_cluster",
        "completed",
    ]
    assert "command exited with code 3" in text and '<svg class="bar"' in text
    assert "&#34;recoverable&#34;" in text or "&quot;recoverable&quot;" in text  # status file
    assert f'href="/tasks/{task_id}/outputs/result.txt"' in text
    assert '<small class="size" title="5 bytes">5 B</small>' in text
    assert 'title="sha256 ab"' in text
    assert html.escape(HOSTILE, quote=False) in text and "<img" not in text
    assert "first run's line" not in text  # run 2 is shown
    assert f'href="/ui/tasks/{task_id}?run=1"' in text
    assert "Traceback" not in text  # a user gets the brief, not the servers' insides
    data: dict[str, Any] = _page_data(page)
    assert data["page"] == "task" and data["run"] == 2 and data["live_log"] is True
    assert data["topics"] == [f"task.*.{job_id}", f"log.*.{job_id}"]


async def test_an_earlier_run_is_shown_as_history_and_operators_see_the_error_detail(
    api: Api,
) -> None:
    _, task_id = await _task_with_history(api)

    earlier = await api.client.get(f"/ui/tasks/{task_id}?run=1", headers=_cookie(api.user))
    as_operator = await api.client.get(f"/ui/tasks/{task_id}", headers=_cookie(api.operator))

    assert "first run&#39;s line" in earlier.text or "first run's line" in earlier.text
    assert _page_data(earlier)["live_log"] is False
    assert "Traceback: /srv/x" in as_operator.text


async def test_another_users_task_is_not_found_page_and_fragment(api: Api) -> None:
    theirs = await api.submit(api.other)
    task_id = await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", theirs["id"])

    page = await api.client.get(f"/ui/tasks/{task_id}", headers=_cookie(api.user))
    head = await api.client.get(f"/ui/tasks/{task_id}/head", headers=_cookie(api.user))

    assert page.status_code == 404 and "does not exist" in page.text
    assert head.status_code == 404


async def test_the_head_fragment_is_the_pages_head(api: Api) -> None:
    _, task_id = await _task_with_history(api)

    head = await api.client.get(f"/ui/tasks/{task_id}/head", headers=_cookie(api.user))

    assert head.status_code == 200
    assert head.text.lstrip().startswith(f'<section id="task-head" data-task-id="{task_id}"')


def _attempt(n: int, start: float, end: float | None) -> Attempt:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return Attempt(
        id=n, task_id="t", attempt=n, run_number=1, stage="cluster", host=None, worker=None,
        claim=None, pid=None, started_at=t0 + timedelta(seconds=start),
        ended_at=t0 + timedelta(seconds=end) if end is not None else None, outcome=None,
        exit_code=None, signal=None, failure_class=None, error_brief=None, error_detail=None,
        log_path=None,
    )  # fmt: skip


def test_the_timeline_puts_attempts_on_one_axis_and_a_running_one_ends_now() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=100)

    bars = dashboard.timeline([_attempt(2, 50, None), _attempt(1, 0, 10)], now)

    assert [(b.attempt.attempt, b.left, b.width, b.seconds) for b in bars] == [
        (1, 0.0, 10.0, 10.0),
        (2, 50.0, 50.0, None),
    ]
    tiny = dashboard.timeline([_attempt(1, 0, 0)], now)[0]
    assert tiny.width == dashboard.MIN_BAR  # an instant still shows
