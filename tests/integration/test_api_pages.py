"""The dashboard's server side: signing in, pages, fragments, escaping and access (no browser).

The browser itself is exercised by `tests/e2e/test_dashboard.py`.
"""

import html
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from services.api import session
from shared.store import activity, attempts_repo
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration

HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


def _token(caller: Caller) -> str:
    return caller.headers["Authorization"].removeprefix("Bearer ")


def _cookie(caller: Caller, **extra: str) -> dict[str, str]:
    """Headers of a browser signed in as `caller` (the session cookie, no bearer)."""
    return {"Cookie": f"{session.COOKIE}={_token(caller)}", **extra}


def _page_data(page: httpx.Response) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="vigil-page">(.*?)</script>', page.text)
    assert found, page.text
    data: dict[str, Any] = json.loads(found.group(1))
    return data


async def _jobs_of(api: Api, caller: Caller, count: int) -> list[str]:
    """Given-step: `count` jobs of `caller`, made in SQL (no rate limit), oldest first."""
    rows = await api.pool.fetch(
        "INSERT INTO jobs (id, owner_id, name, type, command, created_at)"
        " SELECT 'j-p' || $3 || '-' || i, $1, 'bulk ' || i, 'shell', 'true',"
        "  now() - make_interval(secs => $2 - i)"
        " FROM generate_series(1, $2) AS i RETURNING id",
        caller.user.id,
        count,
        uuid.uuid4().hex[:8],
    )
    return [r["id"] for r in rows]


async def test_when_not_signed_in__pages_send_to_the_sign_in_form(api: Api) -> None:
    for path in ("/", "/ui/hosts", "/ui/jobs/j-abc"):
        response = await api.client.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"] == "/login"
    form = await api.client.get("/login")
    assert form.status_code == 200
    assert 'name="token"' in form.text
    assert "script-src 'self'" in form.headers["content-security-policy"]


async def test_when_a_valid_token_is_posted__an_http_only_strict_session_cookie_is_set(
    api: Api,
) -> None:
    response = await api.client.post("/login", data={"token": _token(api.user)})
    assert response.status_code == 303
    assert response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{session.COOKIE}=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/" in cookie
    out = await api.client.post("/logout")
    assert out.status_code == 303
    assert f'{session.COOKIE}="";' in out.headers["set-cookie"]


async def test_the_cookie_holds_a_session_of_its_own_that_signing_out_ends(api: Api) -> None:
    # given a user signed in to the dashboard
    response = await api.client.post("/login", data={"token": _token(api.user)})
    value = response.cookies[session.COOKIE]
    assert value != _token(api.user)  # the pasted token never lives in a cookie
    copied = {"Cookie": f"{session.COOKIE}={value}"}
    assert (await api.client.get("/jobs", headers=copied)).status_code == 200

    # when they sign out
    out = await api.client.post("/logout", headers=copied)

    # then a copy of the cookie no longer works, and the pasted token still does
    assert out.status_code == 303
    api.client.cookies.clear()
    assert (await api.client.get("/jobs", headers=copied)).status_code == 401
    assert (await api.client.get("/jobs", headers=api.user.headers)).status_code == 200


@pytest.mark.parametrize("token", ["", "not-a-token", "x" * 2000])
async def test_when_a_bad_token_is_posted__the_form_says_so_and_no_cookie_is_set(
    api: Api, token: str
) -> None:
    response = await api.client.post("/login", data={"token": token})
    assert response.status_code in (401, 422)
    assert 'id="login-error"' in response.text
    assert "set-cookie" not in response.headers


async def test_when_the_login_form_is_posted_from_another_site__403(api: Api) -> None:
    for origin in ("https://evil.example", "http://api.evil.example", "null"):
        response = await api.client.post(
            "/login", data={"token": _token(api.user)}, headers={"Origin": origin}
        )
        assert response.status_code == 403, origin
        assert "set-cookie" not in response.headers
    own = await api.client.post(
        "/login", data={"token": _token(api.user)}, headers={"Origin": "http://api"}
    )
    assert own.status_code == 303


async def test_when_a_page_is_asked_with_a_bearer_header__it_is_served(api: Api) -> None:
    page = await api.client.get("/", headers=api.user.headers)
    assert page.status_code == 200
    assert _page_data(page)["page"] == "jobs"


async def test_when_a_job_has_a_hostile_name_and_input__every_page_shows_them_as_text(
    api: Api,
) -> None:
    # given
    job = await api.submit(api.user, name=HOSTILE, inputs=["<script>alert(2)</script>"])
    task_id = await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", job["id"])
    await api.pool.execute(
        "INSERT INTO logs (job_id, task_id, run_number, attempt, line_no, ts, severity, stream,"
        " line) VALUES ($1, $2, 1, 1, 1, now(), 'info', 'stdout', $3)",
        job["id"],
        task_id,
        "</div><script>alert(3)</script>",
    )
    headers = _cookie(api.user)

    # when
    pages = [
        await api.client.get("/", headers=headers),
        await api.client.get(f"/ui/jobs/{job['id']}", headers=headers),
        await api.client.get(f"/ui/jobs/{job['id']}/row", headers=headers),
        await api.client.get(f"/ui/jobs/{job['id']}/summary", headers=headers),
        await api.client.get(f"/ui/tasks/{task_id}/row", headers=headers),
    ]

    # then
    for page in pages:
        assert page.status_code == 200, page.text
        assert "<img" not in page.text and "<script>alert" not in page.text
    assert html.escape(HOSTILE, quote=False) in pages[0].text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in pages[1].text
    assert "&lt;/div&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in pages[1].text
    assert html.escape(HOSTILE, quote=False) in pages[2].text


async def test_when_a_job_is_configuring__its_page_shows_test_runs_held_inputs_and_activate(
    api: Api,
) -> None:
    job = await api.submit(api.user, configuring=True, inputs=["a", "b"], retention_s=3600)
    test = await api.client.post(f"/jobs/{job['id']}/tests", json={}, headers=api.user.headers)
    assert test.status_code == 201, test.text

    page = await api.client.get(f"/ui/jobs/{job['id']}", headers=_cookie(api.user))

    assert page.status_code == 200
    assert 'id="job-test-counts"' in page.text and "held inputs</dt><dd>2 " in page.text
    assert 'data-job-action="activate"' in page.text
    assert "data purged 3600 s after the end" in page.text
    assert 'data-index="-1"' in page.text and ">test</span>" in page.text


async def test_when_a_user_signs_in__the_jobs_page_lists_their_jobs_only_and_follows_them(
    api: Api,
) -> None:
    mine = await api.submit(api.user, name="mine")
    theirs = await api.submit(api.other, name="theirs")

    page = await api.client.get("/", headers=_cookie(api.user))

    assert page.status_code == 200
    assert mine["id"] in page.text and theirs["id"] not in page.text
    data = _page_data(page)
    assert data["page"] == "jobs" and data["operator"] is False
    assert f"task.*.{mine['id']}" in data["topics"]
    assert all(not t.endswith(".*") for t in data["topics"])
    assert 'id="emergency-stop"' not in page.text


async def test_the_jobs_list_shows_each_jobs_progress_and_elapsed_time(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a", "b", "c", "d"])
    await api.pool.execute(
        "UPDATE tasks SET state = 'completed' WHERE job_id = $1 AND index < 3", job["id"]
    )
    await api.pool.execute(
        "UPDATE jobs SET created_at = now() - interval '1 hour 2 minutes 5 seconds' WHERE id = $1",
        job["id"],
    )

    page = await api.client.get("/", headers=_cookie(api.user))
    row = await api.client.get(f"/ui/jobs/{job['id']}/row", headers=_cookie(api.user))

    assert "<th>Progress</th><th>Elapsed</th>" in page.text
    for shown in (page.text, row.text):
        assert '<progress max="4" value="3"></progress> 3/4' in shown
        elapsed = re.search(r'<td class="elapsed" data-elapsed="([0-9.]+)" data-ticking', shown)
        assert elapsed is not None and 3725 <= float(elapsed.group(1)) < 3785
        assert re.search(r">1:02:0\d</td>", shown)


async def test_when_an_operator_signs_in__the_jobs_page_shows_owners_and_follows_everything(
    api: Api,
) -> None:
    theirs = await api.submit(api.other, name="theirs")
    page = await api.client.get("/", headers=_cookie(api.operator))
    assert theirs["id"] in page.text
    assert api.other.user.name in page.text
    assert _page_data(page)["topics"] == ["job.*.*", "task.*.*"]
    assert 'id="emergency-stop"' in page.text


async def test_when_there_are_many_jobs__the_list_pages_through_them_newest_first(
    api: Api, session_database_url: str
) -> None:
    # given: a fresh user with 45 jobs
    async with running_api(session_database_url) as fresh:
        ids = await _jobs_of(fresh, fresh.user, 45)
        headers = _cookie(fresh.user)
        seen: list[str] = []
        url: str | None = "/?limit=20"
        pages = 0
        # when: following the "next page" links to the end
        while url is not None:
            page = await fresh.client.get(url, headers=headers)
            assert page.status_code == 200
            rows = re.findall(r'<tr data-job-id="([^"]+)"', page.text)
            assert len(rows) <= 20
            seen += rows
            found = re.search(r'<a href="([^"]+)" id="next-page">', page.text)
            url = html.unescape(found.group(1)) if found else None
            pages += 1
    # then
    assert pages == 3
    assert seen == list(reversed(ids))


async def test_when_an_operator_lists_thousands_of_jobs__one_page_is_rendered(
    api: Api,
) -> None:
    await _jobs_of(api, api.other, 3000)
    page = await api.client.get("/?limit=50", headers=_cookie(api.operator))
    assert page.status_code == 200
    assert len(re.findall(r"<tr data-job-id=", page.text)) == 50
    assert 'id="next-page"' in page.text


async def test_when_a_user_opens_another_users_job__404_page_and_fragments(api: Api) -> None:
    theirs = await api.submit(api.other)
    task_id = await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", theirs["id"])
    headers = _cookie(api.user)
    page = await api.client.get(f"/ui/jobs/{theirs['id']}", headers=headers)
    assert page.status_code == 404
    assert "does not exist" in page.text
    for path in (f"/ui/jobs/{theirs['id']}/row", f"/ui/tasks/{task_id}/row"):
        assert (await api.client.get(path, headers=headers)).status_code == 404


async def test_when_a_user_opens_their_job__it_follows_that_job_and_offers_its_actions(
    api: Api,
) -> None:
    job = await api.submit(api.user, inputs=["a", "b"])
    page = await api.client.get(f"/ui/jobs/{job['id']}", headers=_cookie(api.user))
    assert page.status_code == 200
    data = _page_data(page)
    assert data["topics"] == [f"task.*.{job['id']}", f"job.*.{job['id']}", f"log.*.{job['id']}"]
    assert data["append_new_tasks"] is True
    assert len(re.findall(r"<tr data-task-id=", page.text)) == 2
    assert 'data-job-action="suspend"' in page.text
    assert 'data-job-action="cancel"' in page.text
    assert '<option value="hold">' in page.text


async def test_when_a_cookie_signed_request_changes_something__it_needs_the_dashboard_header(
    api: Api,
) -> None:
    job = await api.submit(api.user)
    url = f"/jobs/{job['id']}/actions"
    body = {"action": "suspend"}

    forged = await api.client.post(url, json=body, headers=_cookie(api.user))
    assert forged.status_code == 403
    assert session.FETCH_HEADER in forged.json()["detail"]

    headers = _cookie(api.user, **{session.FETCH_HEADER: "dashboard"})
    accepted = await api.client.post(url, json=body, headers=headers)
    assert accepted.status_code == 202
    assert accepted.json()["state"] == "suspended"


async def test_when_a_cookie_signs_a_read__no_header_is_needed(api: Api) -> None:
    job = await api.submit(api.user)
    response = await api.client.get(f"/jobs/{job['id']}", headers=_cookie(api.user))
    assert response.status_code == 200


async def test_the_hosts_page_and_its_rows_render_for_any_user(api: Api) -> None:
    page = await api.client.get("/ui/hosts", headers=_cookie(api.user))
    rows = await api.client.get("/ui/hosts/rows", headers=_cookie(api.user))
    pilots = await api.client.get("/ui/hosts/pilots", headers=_cookie(api.user))
    assert page.status_code == 200 and 'id="hosts"' in page.text
    assert 'id="pilots"' in page.text and "<th>Batch job</th>" in page.text
    assert rows.status_code == 200
    assert pilots.status_code == 200


async def _pilot(api: Api, state: str, **columns: Any) -> str:
    """Given-step: a `pilots` row in `state` (made in SQL: no scheduler runs here)."""
    pilot_id = f"p-{uuid.uuid4().hex[:12]}"
    await api.pool.execute(
        "INSERT INTO pilots (id, pool, backend, state, cpus, walltime_s, requested_by)"
        " VALUES ($1, 'default', 'slurm', $2, 4, 3600, 'op')",
        pilot_id,
        state,
    )
    for name, value in columns.items():
        await api.pool.execute(f"UPDATE pilots SET {name} = $2 WHERE id = $1", pilot_id, value)
    return pilot_id


def _batch_id() -> str:
    return str(uuid.uuid4().int % 10**9)  # one batch job id per pilot (a unique index)


async def test_the_hosts_page_shows_which_hosts_are_pilots_and_the_live_pilots(api: Api) -> None:
    # given: a host that is a running pilot, ending in 7.5 minutes (the pilot's end)
    mark = uuid.uuid4().hex[:8]
    host_id, other_host = f"pilot-{mark}", f"pilot-{mark}-b"
    await api.pool.execute(
        "INSERT INTO hosts (id, slots, heartbeat_at) VALUES ($1, 0, now()), ($2, 0, now())",
        host_id,
        other_host,
    )
    ends = await api.pool.fetchval("SELECT now() + interval '450 seconds'")
    running_batch, host_batch, pending_batch = _batch_id(), _batch_id(), _batch_id()
    running = await _pilot(
        api, "running", batch_job_id=running_batch, host_id=host_id, ends_at=ends
    )
    # and one whose end only its host told (hosts.ends_at), two hours and five minutes away
    await api.pool.execute(
        "UPDATE hosts SET ends_at = now() + interval '7530 seconds' WHERE id = $1", other_host
    )
    by_host = await _pilot(api, "running", batch_job_id=host_batch, host_id=other_host)
    # and one pending in the batch system (its host is not up), with a hostile reason
    pending = await _pilot(
        api, "pending", batch_job_id=pending_batch, host_id=f"pilot-{mark}-c", reason=HOSTILE
    )
    ended = await _pilot(api, "ended", reason="walltime", ended_at=ends)

    page = await api.client.get("/ui/hosts", headers=_cookie(api.user))
    rows = await api.client.get("/ui/hosts/rows", headers=_cookie(api.user))
    table = await api.client.get("/ui/hosts/pilots", headers=_cookie(api.user))

    assert page.status_code == rows.status_code == table.status_code == 200
    for text in (page.text, rows.text):
        row = text[text.index(f'data-host-id="{host_id}"') :].split("</tr>")[0]
        assert f'data-pilot-id="{running}"' in row
        assert f"pilot {running} · batch {running_batch} · 7 min left" in row
        row = text[text.index(f'data-host-id="{other_host}"') :].split("</tr>")[0]
        assert f"pilot {by_host} · batch {host_batch} · 2 h 05 min left" in row
    for text in (page.text, table.text):
        pilot_row = text[text.index(f'<tr data-pilot-id="{running}"') :].split("</tr>")[0]
        assert 'data-state="running"' in pilot_row
        assert f'<td class="mono batch">{running_batch}</td>' in pilot_row
        assert f'<td class="mono pilot-host">{host_id}</td>' in pilot_row
        assert "<td>4</td>" in pilot_row and "(7 min left)" in pilot_row
        pilot_row = text[text.index(f'<tr data-pilot-id="{pending}"') :].split("</tr>")[0]
        assert f"pending <small>({html.escape(HOSTILE, quote=False)})</small>" in pilot_row
        assert '<td class="mono pilot-host"><span class="off">not yet</span></td>' in pilot_row
        assert "walltime 1:00:00" in pilot_row
        assert HOSTILE not in text
        assert ended not in text
    assert 'id="no-pilots" hidden' in page.text
    # the pending pilot's host to be is no host's row
    assert f'data-host-id="pilot-{mark}-c"' not in page.text


async def test_the_static_files_are_served(api: Api) -> None:
    script = await api.client.get("/static/dashboard.js")
    style = await api.client.get("/static/dashboard.css")
    assert script.status_code == 200 and "EventSource" in script.text
    assert style.status_code == 200


async def test_an_expired_session_stops_working_and_goes_at_the_next_sign_in(api: Api) -> None:
    first = await api.client.post("/login", data={"token": _token(api.user)})
    copied = {"Cookie": f"{session.COOKIE}={first.cookies[session.COOKIE]}"}
    api.client.cookies.clear()
    await api.pool.execute(
        "UPDATE tokens SET expires_at = now() - interval '1 second' WHERE session AND user_id = $1",
        api.user.user.id,
    )
    assert (await api.client.get("/jobs", headers=copied)).status_code == 401

    await api.client.post("/login", data={"token": _token(api.user)})

    sessions = await api.pool.fetchval(
        "SELECT count(*) FROM tokens WHERE session AND user_id = $1", api.user.user.id
    )
    assert sessions == 1


async def test_the_job_page_shows_the_tasks_of_one_state_and_pages_through_them(
    api: Api,
) -> None:
    job = await api.submit(api.user, inputs=["a", "b", "c"])
    await api.pool.execute(
        "UPDATE tasks SET state = 'on_hold' WHERE job_id = $1 AND index <> 1", job["id"]
    )

    held = await api.client.get(f"/ui/jobs/{job['id']}?state=on_hold", headers=_cookie(api.user))
    every = await api.client.get(f"/ui/jobs/{job['id']}", headers=_cookie(api.user))

    assert re.findall(r'<tr data-task-id="[^"]+" data-state="(\w+)"', held.text) == ["on_hold"] * 2
    assert _page_data(held)["append_new_tasks"] is False  # new tasks are not on_hold
    assert f'href="/ui/jobs/{job["id"]}?state=new" data-state="new">new (1)</a>' in held.text
    assert len(re.findall(r"<tr data-task-id=", every.text)) == 3


async def test_the_rows_of_changed_tasks_come_in_one_fragment_for_that_job_only(
    api: Api,
) -> None:
    mine = await api.submit(api.user, inputs=["a", "b"])
    theirs = await api.submit(api.other, inputs=["x"])
    ids = [
        r["id"]
        for r in await api.pool.fetch(
            "SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", mine["id"]
        )
    ]
    foreign = await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", theirs["id"])
    headers = _cookie(api.user)

    rows = await api.client.get(
        f"/ui/jobs/{mine['id']}/rows",
        params=[("task", ids[1]), ("task", ids[0]), ("task", foreign)],
        headers=headers,
    )
    refused = await api.client.get(
        f"/ui/jobs/{theirs['id']}/rows", params={"task": foreign}, headers=headers
    )
    too_many = await api.client.get(
        f"/ui/jobs/{mine['id']}/rows", params=[("task", ids[0])] * 201, headers=headers
    )
    not_an_id = await api.client.get(
        f"/ui/jobs/{mine['id']}/rows", params={"task": "<x>"}, headers=headers
    )

    assert rows.status_code == 200
    assert re.findall(r'<tr data-task-id="([^"]+)"', rows.text) == ids  # by index, mine only
    assert refused.status_code == 404
    assert too_many.status_code == 422 and not_an_id.status_code == 422


async def test_operators_see_the_systems_charts_and_users_do_not(api: Api) -> None:
    async with api.pool.acquire() as conn:
        tally = activity.Tally()
        tally.count("task.on_cpu.j-charted", b"{}", datetime.now(UTC))
        await tally.flush(conn)

    operator = await api.client.get("/", headers=_cookie(api.operator))
    user = await api.client.get("/", headers=_cookie(api.user))
    fragment = await api.client.get("/ui/charts", headers=_cookie(api.operator))
    refused = await api.client.get("/ui/charts", headers=_cookie(api.user))

    assert 'id="chart-flow"' in operator.text and 'id="chart-failures"' in operator.text
    assert re.search(r'id="chart-flow" data-rects="[1-9]', operator.text)
    assert "chart-flow" not in user.text
    assert fragment.status_code == 200 and fragment.text.lstrip().startswith(
        '<section class="charts"'
    )
    assert refused.status_code == 403


async def test_a_job_page_charts_its_tasks_over_time_and_its_run_times(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a"])
    task_id = await api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", job["id"])
    async with api.pool.acquire() as conn:
        claim = uuid.uuid4()
        await conn.execute("UPDATE tasks SET claim = $2 WHERE id = $1", task_id, claim)
        attempt = await attempts_repo.start(conn, task_id, claim, "cluster", host="h", worker="w")
        await attempts_repo.finish(conn, task_id, attempt.attempt, "completed", exit_code=0)
        tally = activity.Tally()
        tally.count(f"task.completed.{job['id']}", b"{}", datetime.now(UTC))
        await tally.flush(conn)

    page = await api.client.get(f"/ui/jobs/{job['id']}", headers=_cookie(api.user))
    fragment = await api.client.get(f"/ui/jobs/{job['id']}/charts", headers=_cookie(api.user))
    theirs = await api.client.get(f"/ui/jobs/{job['id']}/charts", headers=_cookie(api.other))

    assert re.search(r'id="chart-job-flow" data-rects="1"', page.text)
    assert re.search(r'id="chart-run-times" data-rects="1"', page.text)
    assert 'class="k-completed"' in fragment.text
    assert theirs.status_code == 404


async def test_a_purged_jobs_task_page_says_so_and_lists_no_outputs(api: Api) -> None:
    # given: a task with a recorded output, then its job purged
    job = await api.submit(api.user, inputs=["a"])
    [task] = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()
    await api.pool.execute(
        "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256)"
        " VALUES ($1, 1, 'result.txt', '/gone/result.txt', 'h-1', 3, 'x')",
        task["id"],
    )
    before = await api.client.get(f"/ui/tasks/{task['id']}/head", headers=_cookie(api.user))
    await api.pool.execute(
        "UPDATE jobs SET purged_at = now(), purged_by = 'retention' WHERE id = $1", job["id"]
    )

    # when
    after = await api.client.get(f"/ui/tasks/{task['id']}/head", headers=_cookie(api.user))

    # then
    assert 'id="task-outputs"' in before.text and "result.txt" in before.text
    assert after.status_code == 200
    assert "result.txt" not in after.text
    assert 'id="task-outputs-purged"' in after.text and "by retention" in after.text
