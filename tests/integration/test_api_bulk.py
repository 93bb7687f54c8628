"""`POST /bulk/actions` and `GET /bulk/actions` (global fixes) on the real database.

Tasks are put in the states a test needs with plain SQL. The session database is shared with
other modules, so every selector names this test's own jobs (a unique job name prefix or the
job ids), except a user's, which the api limits to their own jobs anyway.
"""

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.test_api_harness import Api, Caller, running_api
from vigil import AsyncClient, Conflict, InvalidRequest

pytestmark = pytest.mark.integration

CONFIRM_OVER = 4
MAX_TASKS = 12


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(
        session_database_url,
        max_inputs=20,
        bulk_confirm_over=CONFIRM_OVER,
        bulk_max_tasks=MAX_TASKS,
        bulk_batch=2,
    ) as running:
        yield running


@pytest.fixture
def prefix() -> str:
    """A job name prefix of this test's own."""
    return f"bulk-{uuid.uuid4().hex[:8]}-"


async def _job(api: Api, owner: Caller, name: str, *states: str) -> tuple[str, list[str]]:
    """Given-step: a job of `owner` named `name` with one task per state, forced there."""
    job = await api.submit(owner, name=name, inputs=[f"in-{i}" for i in range(len(states))])
    ids = [
        r["id"]
        for r in await api.pool.fetch(
            "SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job["id"]
        )
    ]
    for task_id, state in zip(ids, states, strict=True):
        await _put(api, task_id, state)
    return job["id"], ids


async def _put(api: Api, task_id: str, state: str, **columns: Any) -> None:
    columns["state"] = state
    if state.startswith("failed_") and "failure_class" not in columns:
        columns["failure_class"] = "exit"
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
    await api.pool.execute(f"UPDATE tasks SET {sets} WHERE id = $1", task_id, *columns.values())


async def _bulk(
    api: Api,
    action: str,
    selector: dict[str, Any],
    caller: Caller | None = None,
    **options: Any,
) -> httpx.Response:
    body = {"action": action, "selector": selector} | options
    headers = (caller or api.operator).headers
    return await api.client.post("/bulk/actions", json=body, headers=headers)


async def _states(api: Api, task_ids: list[str]) -> list[str]:
    rows = await api.pool.fetch(
        "SELECT id, state::text FROM tasks WHERE id = ANY($1::text[])", task_ids
    )
    found = {r["id"]: r["state"] for r in rows}
    return [found[t] for t in task_ids]


async def _records(api: Api, caller: Caller) -> list[dict[str, Any]]:
    response = await api.client.get("/bulk/actions", headers=caller.headers)
    assert response.status_code == 200, response.text
    return list(response.json())


async def test_when_a_dry_run_selects_by_state_and_class__it_counts_and_changes_nothing(
    api: Api, prefix: str
) -> None:
    # given: lost and exit failures in two jobs, and tasks in other states
    job_a, a = await _job(api, api.user, prefix + "a", "failed_on_cluster", "completed", "new")
    job_b, b = await _job(api, api.other, prefix + "b", "failed_on_cluster", "failed_on_cluster")
    for task_id in (a[0], b[0]):
        await _put(api, task_id, "failed_on_cluster", failure_class="lost", host="h-7")
    selector = {
        "states": ["failed_on_cluster"],
        "failure_classes": ["lost"],
        "job_name": prefix + "*",
    }

    # when
    response = await _bulk(api, "recover", selector, dry_run=True)

    # then
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["dry_run"], body["matched"], body["jobs"]) == (True, 2, 2)
    assert (body["applied"], body["refused"], body["refusals"]) == (2, 0, {})
    sample = sorted(
        (t["job_id"], t["id"], t["state"], t["failure_class"], t["host"]) for t in body["sample"]
    )
    assert sample == sorted(
        [
            (job_a, a[0], "failed_on_cluster", "lost", "h-7"),
            (job_b, b[0], "failed_on_cluster", "lost", "h-7"),
        ]
    )
    assert await _states(api, a + b) == [
        "failed_on_cluster", "completed", "new", "failed_on_cluster", "failed_on_cluster"
    ]  # fmt: skip
    [record] = [r for r in await _records(api, api.operator) if r["id"] == body["id"]]
    assert record["dry_run"] is True and record["finished_at"] is not None
    assert (record["actor"], record["role"], record["action"]) == (
        api.operator.user.name, "operator", "recover"
    )  # fmt: skip
    assert record["selector"] == selector
    assert (record["matched"], record["jobs"], record["applied"]) == (2, 2, 2)


async def test_when_a_bulk_recover_is_applied__fit_tasks_move_and_the_rest_are_counted_by_reason(
    api: Api, prefix: str
) -> None:
    # given
    job_a, a = await _job(api, api.user, prefix + "a", "failed_on_cluster", "completed")
    job_b, b = await _job(api, api.user, prefix + "b", "failed_to_setup", "completed")
    selector = {
        "states": ["failed_on_cluster", "failed_to_setup", "completed"],
        "job_name": prefix + "*",
    }

    # when
    response = await _bulk(api, "recover", selector, confirm=True)

    # then
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["dry_run"], body["matched"], body["jobs"], body["applied"]) == (False, 4, 2, 2)
    assert (body["refused"], body["refusals"]) == (2, {"not allowed in state completed": 2})
    assert await _states(api, a + b) == [
        "recover_cluster", "completed", "recover_setup", "completed"
    ]  # fmt: skip
    keys = await api.pool.fetch(
        "SELECT routing_key FROM outbox WHERE body->>'task_id' = ANY($1::text[])", [a[0], b[0]]
    )
    assert {r["routing_key"] for r in keys} >= {
        f"task.recover_cluster.{job_a}",
        f"task.recover_setup.{job_b}",
    }
    record = await api.pool.fetchrow("SELECT * FROM bulk_actions WHERE id = $1", body["id"])
    assert record is not None
    assert (record["applied"], record["refused"]) == (2, 2)
    assert record["refusals"] == {"not allowed in state completed": 2}
    assert record["finished_at"] is not None


async def test_when_the_dry_run_and_the_run_meet_the_same_tasks__they_agree(
    api: Api, prefix: str
) -> None:
    _job_id, ids = await _job(api, api.user, prefix + "x", "new", "on_cpu", "completed", "on_hold")
    selector = {"job_name": prefix + "x"}

    dry = (await _bulk(api, "hold", selector, dry_run=True)).json()
    done = (await _bulk(api, "hold", selector)).json()

    for key in ("matched", "jobs", "applied", "refused", "refusals"):
        assert dry[key] == done[key], key
    assert done["refusals"] == {
        "not allowed in state on_cpu": 1,
        "not allowed in state completed": 1,
        "not allowed in state on_hold": 1,
    }
    assert await _states(api, ids) == ["on_hold", "on_cpu", "completed", "on_hold"]


async def test_when_more_tasks_match_than_the_threshold__409_until_confirmed(
    api: Api, prefix: str
) -> None:
    # given: one more task than the threshold, in two jobs
    _a, a = await _job(api, api.user, prefix + "a", *["new"] * 3)
    _b, b = await _job(api, api.user, prefix + "b", *["new"] * 2)
    selector = {"job_name": prefix + "*", "states": ["new"]}
    before = await api.pool.fetchval("SELECT count(*) FROM bulk_actions")

    # when
    refused = await _bulk(api, "cancel", selector)

    # then: nothing changed, nothing recorded
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (
        f"the selector matches 5 tasks in 2 jobs (more than {CONFIRM_OVER});"
        ' repeat with "confirm": true (`--yes`), or narrow the selector'
    )
    assert refused.json()["next_step"].startswith('repeat with "confirm": true')
    assert set(await _states(api, a + b)) == {"new"}
    assert await api.pool.fetchval("SELECT count(*) FROM bulk_actions") == before

    # when confirmed
    confirmed = await _bulk(api, "cancel", selector, confirm=True)

    # then
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["applied"] == 5
    assert set(await _states(api, a + b)) == {"terminated"}
    briefs = await api.pool.fetch(
        "SELECT DISTINCT error_brief FROM tasks WHERE id = ANY($1::text[])", a + b
    )
    assert [r["error_brief"] for r in briefs] == [f"cancelled by {api.operator.user.name}"]


async def test_when_more_tasks_match_than_one_bulk_action_may_touch__422_even_confirmed(
    api: Api, prefix: str
) -> None:
    for part in "abc":
        await _job(api, api.user, prefix + part, *["new"] * 5)

    response = await _bulk(api, "cancel", {"job_name": prefix + "*"}, confirm=True)

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "selector"]
    assert error["msg"] == (
        f"the selector matches more than {MAX_TASKS} tasks, the most one bulk action may"
        " touch; narrow it"
    )
    states = await api.pool.fetch(
        "SELECT DISTINCT t.state::text FROM tasks t JOIN jobs j ON j.id = t.job_id"
        " WHERE j.name LIKE $1",
        prefix + "%",
    )
    assert [r["state"] for r in states] == ["new"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"action": "recover", "selector": {}}, "the selector is empty: name at least one of"),
        ({"action": "recover", "selector": {"include_superseded": True}}, "the selector is empty"),
        ({"action": "recover"}, "Field required"),
        ({"action": "reboot", "selector": {"states": ["new"]}}, "Input should be"),
        ({"action": "recover", "selector": {"state": ["new"]}}, "Extra inputs are not permitted"),
        ({"action": "recover", "selector": {"hosts": ["../etc"]}}, "is not a valid id"),
        ({"action": "recover", "selector": {"job_name": "a\u0007"}}, "printable text"),
        (
            {"action": "recover", "selector": {"updated_after": "2024-01-01T00:00:00"}},
            "timezone",
        ),
    ],
)
async def test_when_the_body_is_wrong__422_names_what_is_wrong_and_nothing_is_recorded(
    api: Api, body: dict[str, Any], message: str
) -> None:
    before = await api.pool.fetchval("SELECT count(*) FROM bulk_actions")

    response = await api.client.post("/bulk/actions", json=body, headers=api.operator.headers)

    assert response.status_code == 422, response.text
    assert message in " ".join(e["msg"] for e in response.json()["detail"])
    assert await api.pool.fetchval("SELECT count(*) FROM bulk_actions") == before


async def test_when_a_user_acts_in_bulk__only_their_own_tasks_are_touched_and_seen(
    api: Api, prefix: str
) -> None:
    # given: the same name and states for two users
    _mine, mine = await _job(api, api.user, prefix + "same", "queued", "new")
    theirs_job, theirs = await _job(api, api.other, prefix + "same", "queued", "new")

    # when: broad criteria, and even the other user's job named
    by_state = await _bulk(api, "cancel", {"states": ["queued", "new"]}, api.user)
    by_id = await _bulk(api, "cancel", {"job_ids": [theirs_job]}, api.user)

    # then
    assert by_state.status_code == 200, by_state.text
    assert (by_state.json()["matched"], by_state.json()["applied"]) == (2, 2)
    assert by_id.json()["matched"] == 0
    assert await _states(api, mine) == ["terminated", "terminated"]
    assert await _states(api, theirs) == ["queued", "new"]
    # each user sees their own records; an operator sees everyone's
    assert {r["id"] for r in await _records(api, api.user)} == {
        by_state.json()["id"],
        by_id.json()["id"],
    }
    assert await _records(api, api.other) == []
    everyone = {r["id"] for r in await _records(api, api.operator)}
    assert {by_state.json()["id"], by_id.json()["id"]} <= everyone


async def test_when_job_names_hold_like_wildcards__a_glob_matches_them_literally(
    api: Api, prefix: str
) -> None:
    exact, _ = await _job(api, api.user, prefix + "50%_x\\", "new")
    for lookalike in ("50ab_x\\", "50%_x\\tail", "50%Zx\\", "50%_xx"):
        await _job(api, api.user, prefix + lookalike, "new")

    literal = (await _bulk(api, "hold", {"job_name": prefix + "50%_x\\"}, dry_run=True)).json()
    wild = (await _bulk(api, "hold", {"job_name": prefix + "50?_x*"}, dry_run=True)).json()

    assert [t["job_id"] for t in literal["sample"]] == [exact]
    assert wild["matched"] == 3  # 50%_x\, 50%_x\tail and 50%_xx


async def test_when_a_failed_task_was_resubmitted__it_is_left_out_unless_asked_for(
    api: Api, prefix: str
) -> None:
    _job_id, [old, clone] = await _job(api, api.user, prefix + "r", "failed_on_cluster", "new")
    await api.pool.execute("UPDATE tasks SET superseded_by = $2 WHERE id = $1", old, clone)
    selector: dict[str, Any] = {"job_name": prefix + "r", "states": ["failed_on_cluster"]}

    left_out = (await _bulk(api, "recover", selector, dry_run=True)).json()
    included = (
        await _bulk(api, "recover", selector | {"include_superseded": True}, dry_run=True)
    ).json()

    assert left_out["matched"] == 0
    assert [t["id"] for t in included["sample"]] == [old]


async def test_when_a_time_range_is_given__tasks_are_selected_by_when_they_last_changed(
    api: Api, prefix: str
) -> None:
    _job_id, ids = await _job(api, api.user, prefix + "t", "new", "new", "new")
    t0 = datetime(2024, 5, 1, tzinfo=UTC)
    for hours, task_id in enumerate(ids):
        await _put(api, task_id, "new", updated_at=t0 + timedelta(hours=hours))
    after = (t0 + timedelta(minutes=30)).isoformat()
    before = (t0 + timedelta(hours=2)).isoformat()
    selector = {"job_name": prefix + "t", "updated_after": after, "updated_before": before}

    body = (await _bulk(api, "hold", selector, dry_run=True)).json()

    assert [t["id"] for t in body["sample"]] == [ids[1]]


async def test_when_a_job_is_cancelled_or_purged__its_tasks_are_refused_saying_so(
    api: Api, prefix: str
) -> None:
    cancelled, first = await _job(api, api.user, prefix + "c", "failed_on_cluster")
    purged, second = await _job(api, api.user, prefix + "p", "failed_on_cluster")
    await api.pool.execute("UPDATE jobs SET state = 'cancelled' WHERE id = $1", cancelled)
    await api.pool.execute(
        "UPDATE jobs SET state = 'failed', finished_at = now(), purged_at = now(),"
        " purged_by = 'ops' WHERE id = $1",
        purged,
    )
    selector = {"job_ids": [cancelled, purged]}

    dry = (await _bulk(api, "recover", selector, dry_run=True)).json()
    body = (await _bulk(api, "recover", selector)).json()

    expected = {"the job is cancelled": 1, "the job was purged": 1}
    assert (body["applied"], body["refusals"]) == (0, expected)
    assert (dry["applied"], dry["refusals"]) == (0, expected)
    assert await _states(api, first + second) == ["failed_on_cluster", "failed_on_cluster"]


async def test_when_completed_tasks_are_duplicated_in_bulk__each_gets_a_new_task(
    api: Api, prefix: str
) -> None:
    job_id, _ids = await _job(api, api.user, prefix + "d", "completed", "completed")
    await api.pool.execute(
        "UPDATE jobs SET state = 'completed', finished_at = now() WHERE id = $1", job_id
    )

    body = (await _bulk(api, "duplicate", {"job_ids": [job_id]})).json()

    assert (body["matched"], body["applied"]) == (2, 2)
    rows = await api.pool.fetch(
        "SELECT index, state::text, input FROM tasks WHERE job_id = $1 ORDER BY index", job_id
    )
    assert [(r["index"], r["state"]) for r in rows] == [
        (0, "completed"), (1, "completed"), (2, "new"), (3, "new")
    ]  # fmt: skip
    assert await api.pool.fetchval("SELECT state::text FROM jobs WHERE id = $1", job_id) == "active"


async def test_when_records_are_listed__they_come_newest_first_and_page_with_before(
    api: Api, prefix: str
) -> None:
    job_id, _ = await _job(api, api.user, prefix + "p", "new")
    made = [
        (await _bulk(api, "hold", {"job_ids": [job_id]}, api.user, dry_run=True)).json()["id"]
        for _ in range(3)
    ]

    first = await api.client.get("/bulk/actions", params={"limit": 2}, headers=api.user.headers)
    rest = await api.client.get(
        "/bulk/actions", params={"limit": 2, "before": made[1]}, headers=api.user.headers
    )

    assert [r["id"] for r in first.json()] == [made[2], made[1]]
    assert [r["id"] for r in rest.json()] == [made[0]]


async def test_when_the_client_library_acts_in_bulk__it_gets_the_result_and_the_errors(
    api: Api, prefix: str
) -> None:
    token = api.user.headers["Authorization"].removeprefix("Bearer ")
    client = AsyncClient("http://api", token, http=api.client)
    _job_id, ids = await _job(api, api.user, prefix + "lib", *["new"] * (CONFIRM_OVER + 1))
    selector = {"job_name": prefix + "lib"}

    dry = await client.bulk_action("hold", selector, dry_run=True)
    with pytest.raises(Conflict, match='repeat with "confirm": true'):
        await client.bulk_action("hold", selector)
    with pytest.raises(InvalidRequest, match="the selector is empty"):
        await client.bulk_action("hold", {})
    done = await client.bulk_action("hold", selector, confirm=True)
    records = await client.bulk_actions(limit=5)

    assert (dry["matched"], dry["applied"], dry["dry_run"]) == (len(ids), len(ids), True)
    assert (done["applied"], done["actor"]) == (len(ids), api.user.user.name)
    assert [r["id"] for r in records] == [done["id"], dry["id"]]
    assert set(await _states(api, ids)) == {"on_hold"}
