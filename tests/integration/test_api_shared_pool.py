"""The shared pool as the api shows it on the real database: a job's request of
resources and priority at submission and by `PATCH /jobs/{id}`, users' shares, hosts'
capacity and what is free, and why a task or a job waits."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import REDIS_URL
from tests.integration.test_api_harness import Api, Caller, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str, namespace: str) -> AsyncIterator[Api]:
    # a pool of its own: the live hosts its tests make are no other test's
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    async with running_api(
        session_database_url, namespace=namespace, redis_url=REDIS_URL, worker_pool=pool
    ) as running:
        yield running


async def _post(api: Api, caller: Caller, **body: Any) -> tuple[int, Any]:
    body.setdefault("command", "true")
    response = await api.client.post("/jobs", json=body, headers=caller.headers)
    return response.status_code, response.json()


async def _patch(api: Api, caller: Caller, job_id: str, **body: Any) -> tuple[int, Any]:
    response = await api.client.patch(f"/jobs/{job_id}", json=body, headers=caller.headers)
    return response.status_code, response.json()


def _msgs(answer: Any) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in answer["detail"])


# -- submission ------------------------------------------------------------------------------


async def test_a_jobs_request_and_priority_are_kept_in_its_columns_and_shown(api: Api) -> None:
    # when a job asks for half a CPU, 2 GiB and a GPU at priority 40, and another names none
    job = await api.submit(
        api.user, resources={"cpus": 0.5, "memory_mb": 2048, "gpus": 1}, priority=40
    )
    plain = await api.submit(api.user)

    # then both are shown as submitted, and kept in the job's columns
    assert (job["resources"], job["priority"]) == ({"cpus": 0.5, "memory_mb": 2048, "gpus": 1}, 40)
    assert (plain["resources"], plain["priority"]) == ({"cpus": 1.0, "memory_mb": 0, "gpus": 0}, 0)
    row = await api.pool.fetchrow(
        "SELECT priority, req_millicpus, req_memory_mb, req_gpus FROM jobs WHERE id = $1",
        job["id"],
    )
    assert row is not None
    assert tuple(row) == (40, 500, 2048, 1)
    shown = (await api.client.get(f"/jobs/{job['id']}", headers=api.user.headers)).json()
    assert (shown["resources"], shown["priority"]) == (job["resources"], 40)


async def test_a_malformed_request_or_a_priority_out_of_range_is_a_422_that_writes_nothing(
    api: Api,
) -> None:
    before = await api.jobs_of(api.user)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"resources": {"cpus": 0}}, "resources.cpus: Input should be greater than 0"),
        ({"resources": {"cpus": 2.0005}}, "more than 3 decimals"),
        ({"resources": {"cpus": 4096}}, "less than or equal to 1024"),
        ({"resources": {"memory_mb": -1}}, "resources.memory_mb"),
        ({"resources": {"gpus": 65}}, "resources.gpus"),
        ({"resources": {"gpus": "two"}}, "resources.gpus"),
        ({"resources": {"disk_gb": 1}}, "resources.disk_gb"),
        ({"resources": 4}, "resources"),
        ({"priority": 101}, "a user may set -100 to 100 (VIGIL_PRIORITY_USER_RANGE)"),
        ({"priority": -101}, "operators -1000000 to 1000000"),
        ({"priority": 2_000_000}, "-1000000 to 1000000"),
        ({"priority": 1.5}, "priority"),
        ({"priority": 10**40}, "priority"),
    ]
    for body, says in cases:
        status, answer = await _post(api, api.user, **body)
        assert (status, says in _msgs(answer)) == (422, True), (body, answer)
    assert await api.jobs_of(api.user) == before


async def test_an_operator_sets_any_priority_within_a_million(api: Api) -> None:
    status, job = await _post(api, api.operator, priority=-1_000_000)
    assert (status, job["priority"]) == (201, -1_000_000)
    status, answer = await _post(api, api.operator, priority=1_000_001)
    assert status == 422 and "-1000000 to 1000000" in _msgs(answer)


async def test_the_users_range_is_a_setting(session_database_url: str) -> None:
    async with running_api(session_database_url, priority_user_range=5) as api:
        assert (await _post(api, api.user, priority=5))[0] == 201
        status, answer = await _post(api, api.user, priority=6)
    assert status == 422 and "a user may set -5 to 5" in _msgs(answer)


async def _live_host(api: Api, cpus: int, memory_mb: int, gpus: list[str], **hb: Any) -> str:
    """Given-step: a host of the api's pool whose worker heartbeated `age_s` ago."""
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    await api.pool.execute(
        "INSERT INTO hosts (id, slots, worker, pool, heartbeat_at, capacity_millicpus,"
        " capacity_memory_mb, gpu_ids)"
        " VALUES ($1, 4, 'w-1', $2, now() - make_interval(secs => $3), $4, $5, $6)",
        host_id,
        api.settings.worker_pool,
        hb.get("age_s", 0),
        cpus * 1000,
        memory_mb,
        gpus,
    )
    return host_id


async def test_with_refuse_unsatisfiable_a_request_no_live_host_can_hold_is_refused(
    session_database_url: str,
) -> None:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    async with running_api(
        session_database_url, refuse_unsatisfiable=True, worker_pool=pool
    ) as api:
        # with no host known, nothing is refused (it would wait)
        assert (await _post(api, api.user, resources={"cpus": 64}))[0] == 201
        small = await _live_host(api, 4, 8192, [])
        big = await _live_host(api, 16, 65536, ["0", "1"])
        await _live_host(api, 128, 1_000_000, [], age_s=3600)  # silent: not counted
        before = await api.jobs_of(api.user)

        status, answer = await _post(api, api.user, resources={"cpus": 64})
        gpus, gpu_answer = await _post(api, api.user, resources={"cpus": 1, "gpus": 4})
        fits, job = await _post(api, api.user, resources={"cpus": 16, "gpus": 2})
        configuring = await api.submit(api.user, configuring=True)
        edit, edit_answer = await _patch(
            api, api.user, configuring["id"], resources={"memory_mb": 100_000}
        )
        made = await api.jobs_of(api.user) - before

    assert status == 422, answer
    assert _msgs(answer) == (
        f"body.resources: no host can ever hold it: needs 64 cpus; the largest host, {big},"
        " has 16 cpus, 65536 MiB, 2 gpus (the api refuses what no host can hold)"
    )
    assert gpus == 422 and big in _msgs(gpu_answer) and small not in _msgs(gpu_answer)
    assert edit == 422 and "needs 1 cpu, 100000 MiB" in _msgs(edit_answer)
    assert fits == 201, job
    assert made == 2  # the one that fits, and the configuring one


# -- PATCH /jobs/{id} ------------------------------------------------------------------------


async def test_an_active_jobs_priority_is_changed_by_its_owner_or_an_operator(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a", "b"], max_in_flight=7)

    mine = await _patch(api, api.user, job["id"], priority=-30)
    ops = await _patch(api, api.operator, job["id"], priority=900)
    too_high = await _patch(api, api.user, job["id"], priority=500)
    theirs = await _patch(api, api.other, job["id"], priority=1)

    assert mine[0] == 200 and (mine[1]["priority"], mine[1]["state"]) == (-30, "active")
    assert mine[1]["max_in_flight"] == 7 and mine[1]["counts"] == {"new": 2}
    assert ops[0] == 200 and ops[1]["priority"] == 900
    assert too_high[0] == 422 and "a user may set -100 to 100" in _msgs(too_high[1])
    assert theirs[0] == 404
    assert await api.pool.fetchval("SELECT priority FROM jobs WHERE id = $1", job["id"]) == 900
    edits = await api.pool.fetch(
        "SELECT actor, state, changes FROM job_edits WHERE job_id = $1 ORDER BY at", job["id"]
    )
    assert [(e["state"], e["changes"]) for e in edits] == [
        ("active", {"priority": -30}),
        ("active", {"priority": 900}),
    ]


async def test_a_suspended_jobs_priority_changes_a_cancelled_ones_does_not(api: Api) -> None:
    job = await api.submit(api.user)
    for priority, action in enumerate(("suspend", "cancel"), start=3):
        answer = await api.client.post(
            f"/jobs/{job['id']}/actions", json={"action": action}, headers=api.user.headers
        )
        assert answer.status_code == 202, answer.text
        status, _ = await _patch(api, api.user, job["id"], priority=priority)
        assert status == (200 if action == "suspend" else 409)


async def test_a_configuring_jobs_request_is_edited_an_active_ones_is_not(api: Api) -> None:
    job = await api.submit(api.user, configuring=True, inputs=["x"])

    status, edited = await _patch(
        api, api.user, job["id"], resources={"cpus": 2, "memory_mb": 512}, priority=9
    )
    assert status == 200, edited
    assert (edited["resources"], edited["priority"]) == (
        {"cpus": 2.0, "memory_mb": 512, "gpus": 0},
        9,
    )
    bad, answer = await _patch(api, api.user, job["id"], resources={"cpus": 0.0001})
    assert bad == 422 and "resources.cpus" in _msgs(answer)
    activated = await api.client.post(
        f"/jobs/{job['id']}/actions", json={"action": "activate"}, headers=api.user.headers
    )
    assert activated.status_code == 202, activated.text

    refused, why = await _patch(api, api.user, job["id"], resources={"cpus": 4})
    same, _ = await _patch(api, api.user, job["id"], resources={"cpus": 2, "memory_mb": 512})

    assert refused == 409
    assert why["detail"].startswith(f"job {job['id']} is active: resources can no longer")
    assert same == 200  # the same request again changes nothing: not refused


# -- users' shares ---------------------------------------------------------------------------


async def test_an_operator_sets_a_users_share_and_users_show_share_and_usage(api: Api) -> None:
    name = api.other.user.name
    ops = api.operator.headers

    response = await api.client.patch(f"/admin/users/{name}", json={"share": 3}, headers=ops)

    assert response.status_code == 200, response.text
    assert (response.json()["name"], response.json()["share"]) == (name, 3.0)
    listed = (await api.client.get("/admin/users", headers=ops)).json()
    [shown] = [u for u in listed if u["name"] == name]
    assert (shown["share"], shown["usage"]) == (3.0, 0.0) and shown["usage_at"] is not None
    assert await api.pool.fetchval("SELECT share FROM users WHERE name = $1", name) == 3.0


async def test_a_share_is_for_operators_to_set_within_its_range(api: Api) -> None:
    name = api.other.user.name
    ops = api.operator.headers
    url = f"/admin/users/{name}"

    as_user = await api.client.patch(url, json={"share": 5}, headers=api.user.headers)
    unknown = await api.client.patch("/admin/users/nobody-x", json={"share": 5}, headers=ops)
    bad = [
        await api.client.patch(url, json=body, headers=ops)
        for body in ({"share": 0}, {"share": -1}, {"share": 2e6}, {"share": "1"}, {}, {"x": 1})
    ]

    assert as_user.status_code == 403
    assert unknown.status_code == 404 and "nobody-x" in unknown.text
    assert [b.status_code for b in bad] == [422] * 6
    assert "share 0.0 is out of range: more than 0, from 1e-06 to 1,000,000" in bad[0].text
    assert await api.pool.fetchval("SELECT share FROM users WHERE name = $1", name) == 1.0


# -- hosts -----------------------------------------------------------------------------------


async def test_hosts_show_their_capacity_and_what_their_tasks_leave_free(api: Api) -> None:
    # given: a host of 8 CPUs, 16 GiB and GPUs 0 to 3, holding two tasks of 2 CPUs, 4 GiB and
    # a GPU each (one running, one placed and not yet started), and a third that ended
    host_id = await _live_host(api, 8, 16384, ["0", "1", "2", "3"])
    job = await api.submit(
        api.user, inputs=["a", "b", "c"], resources={"cpus": 2, "memory_mb": 4096, "gpus": 1}
    )
    tasks = await api.pool.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job["id"])
    for row, state, gpu in zip(tasks, ("on_cpu", "new", "completed"), ("2", "0", "1"), strict=True):
        await api.pool.execute(
            "UPDATE tasks SET state = $2::task_state, host = $3, gpu_ids = ARRAY[$4],"
            " claim = CASE WHEN $2 = 'completed' THEN NULL ELSE gen_random_uuid() END"
            " WHERE id = $1",
            row["id"],
            state,
            host_id,
            gpu,
        )

    # when
    hosts = (await api.client.get("/hosts", headers=api.user.headers)).json()

    # then
    [host] = [h for h in hosts if h["id"] == host_id]
    assert host["capacity"] == {"cpus": 8.0, "memory_mb": 16384, "gpus": ["0", "1", "2", "3"]}
    assert host["free"] == {"cpus": 4.0, "memory_mb": 8192, "gpus": ["1", "3"]}
    assert host["slots"] == 4  # the fields it had stay
    bare = [h for h in hosts if h["capacity"]["cpus"] == 0]
    assert all(h["free"] == {"cpus": 0.0, "memory_mb": 0, "gpus": []} for h in bare)


# -- why it waits ----------------------------------------------------------------------------


async def _task(api: Api, job_id: str, index: int = 0) -> dict[str, Any]:
    task_id = await api.pool.fetchval(
        "SELECT id FROM tasks WHERE job_id = $1 AND index = $2", job_id, index
    )
    response = await api.client.get(f"/tasks/{task_id}", headers=api.user.headers)
    assert response.status_code == 200, response.text
    shown: dict[str, Any] = response.json()
    return shown


async def _job(api: Api, job_id: str) -> dict[str, Any]:
    response = await api.client.get(f"/jobs/{job_id}", headers=api.user.headers)
    assert response.status_code == 200, response.text
    shown: dict[str, Any] = response.json()
    return shown


async def _wait_row(api: Api, job_id: str, reason: str, message: str, **detail: Any) -> None:
    await api.pool.execute(
        "INSERT INTO job_waits (job_id, reason, message, detail) VALUES ($1, $2, $3, $4)",
        job_id,
        reason,
        message,
        detail,
    )


async def test_a_new_task_waits_for_the_round_then_for_its_jobs_reason(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a", "b", "c"])

    before = await _task(api, job["id"])
    await _wait_row(
        api, job["id"], "fair_share", "fair share: 12 tasks of other users ahead", ahead=12
    )
    after = await _task(api, job["id"])
    shown = await _job(api, job["id"])

    assert before["waiting_reason"] == {
        "reason": "pending",
        "message": "waiting for the scheduler's next round",
        "detail": {},
    }
    expected = {
        "reason": "fair_share",
        "message": "fair share: 12 tasks of other users ahead",
        "detail": {"ahead": 12},
    }
    assert after["waiting_reason"] == expected
    assert shown["waiting"] == expected | {"tasks": 3}


async def test_a_job_counts_only_its_tasks_not_yet_placed(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a", "b", "c"])
    await _wait_row(api, job["id"], "resources", "next to run, waits for resources")
    await api.pool.execute(
        "UPDATE tasks SET claim = gen_random_uuid(), host = 'h-x' WHERE job_id = $1 AND index = 0",
        job["id"],
    )
    assert (await _job(api, job["id"]))["waiting"]["tasks"] == 2
    placed = await _task(api, job["id"], 0)
    assert placed["waiting_reason"] == {
        "reason": "starting",
        "message": "placed on host h-x, starting",
        "detail": {"host": "h-x"},
    }

    await api.pool.execute(
        "UPDATE tasks SET state = 'completed', claim = NULL WHERE job_id = $1", job["id"]
    )
    done = await _job(api, job["id"])
    assert done["waiting"] is None
    assert (await _task(api, job["id"], 1))["waiting_reason"] is None


async def test_a_suspended_jobs_tasks_say_so_before_their_jobs_reason(api: Api) -> None:
    job = await api.submit(api.user)
    await _wait_row(api, job["id"], "priority", "priority: 1 task ahead")
    answer = await api.client.post(
        f"/jobs/{job['id']}/actions", json={"action": "suspend"}, headers=api.user.headers
    )
    assert answer.status_code == 202

    assert (await _task(api, job["id"]))["waiting_reason"]["reason"] == "suspended"
    assert (await _job(api, job["id"]))["waiting"] == {
        "reason": "suspended",
        "message": "the job is suspended",
        "detail": {},
        "tasks": 1,
    }


async def test_an_emergency_stop_is_every_waiting_tasks_reason(api: Api) -> None:
    job = await api.submit(api.user)
    stop = await api.client.post(
        "/admin/emergency-stop", json={"reason": "waiting test"}, headers=api.operator.headers
    )
    assert stop.status_code == 202, stop.text
    try:
        task = await _task(api, job["id"])
        shown = await _job(api, job["id"])
    finally:
        resumed = await api.client.post("/admin/resume", headers=api.operator.headers)
        assert resumed.status_code == 202

    assert task["waiting_reason"]["reason"] == "emergency_stop"
    assert shown["waiting"]["reason"] == "emergency_stop"


async def test_a_task_names_the_prerequisite_it_waits_for(api: Api) -> None:
    upstream = await api.submit(api.user)
    [up_id] = [
        r["id"]
        for r in await api.pool.fetch("SELECT id FROM tasks WHERE job_id = $1", upstream["id"])
    ]
    job = await api.submit(api.user, prerequisites={"setup": {up_id: "completed"}})
    await _wait_row(api, job["id"], "fair_share", "fair share: 1 task of other users ahead")

    task = await _task(api, job["id"])
    shown = await _job(api, job["id"])

    assert task["waiting_reason"] == {
        "reason": "prerequisites",
        "message": f"a prerequisite is not met yet: task {up_id} must reach completed (it is new)",
        "detail": {"task_id": up_id, "required": "completed", "state": "new", "unmet": 1},
    }
    assert shown["waiting"]["reason"] == "fair_share"  # the job's row, for those that may run


async def test_a_resubmitted_task_waits_out_its_backoff(api: Api) -> None:
    job = await api.submit(api.user)
    await api.pool.execute(
        "UPDATE tasks SET not_before = now() + interval '1 hour' WHERE job_id = $1", job["id"]
    )

    why = (await _task(api, job["id"]))["waiting_reason"]

    assert why["reason"] == "backoff"
    assert why["message"].startswith("resubmitted: waits until ")
    assert why["detail"]["not_before"].endswith("+00:00")


async def test_held_and_queued_tasks_say_so_and_running_ones_wait_for_nothing(api: Api) -> None:
    job = await api.submit(api.user, inputs=["a", "b", "c"])
    tasks = await api.pool.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job["id"])
    held = await api.client.post(
        f"/tasks/{tasks[0]['id']}/actions", json={"action": "hold"}, headers=api.user.headers
    )
    assert held.status_code == 202, held.text
    await api.pool.execute(
        "UPDATE tasks SET state = 'queued', host = 'h-q' WHERE id = $1", tasks[1]["id"]
    )
    await api.pool.execute(
        "UPDATE tasks SET state = 'on_cpu', host = 'h-q', claim = gen_random_uuid() WHERE id = $1",
        tasks[2]["id"],
    )

    reasons = [(await _task(api, job["id"], i))["waiting_reason"] for i in range(3)]

    assert reasons[0]["reason"] == "held"
    assert reasons[1] == {
        "reason": "queued_on_host",
        "message": "set up on host h-q, waiting for its turn there",
        "detail": {"host": "h-q"},
    }
    assert reasons[2] is None


async def test_a_configuring_jobs_waiting_tasks_are_its_test_tasks(api: Api) -> None:
    job = await api.submit(api.user, configuring=True, inputs=["x", "y"])
    assert (await _job(api, job["id"]))["waiting"] is None  # held inputs are no tasks

    test = await api.client.post(f"/jobs/{job['id']}/tests", json={}, headers=api.user.headers)
    assert test.status_code == 201, test.text

    assert (await _job(api, job["id"]))["waiting"]["tasks"] == 1
    assert (await _task(api, job["id"], -1))["waiting_reason"]["reason"] == "pending"


# -- the dashboard ---------------------------------------------------------------------------


async def _page(api: Api, caller: Caller, path: str) -> str:
    response = await api.client.get(path, headers=caller.headers)
    assert response.status_code == 200, response.text
    return response.text


async def test_the_job_and_task_pages_show_priority_request_and_why_it_waits(api: Api) -> None:
    job = await api.submit(
        api.user, inputs=["a", "b"], priority=-7, resources={"cpus": 2.5, "memory_mb": 512}
    )
    await _wait_row(api, job["id"], "fair_share", "fair share: 4 tasks of other users ahead")
    task_id = await api.pool.fetchval(
        "SELECT id FROM tasks WHERE job_id = $1 AND index = 0", job["id"]
    )

    page = await _page(api, api.user, f"/ui/jobs/{job['id']}")
    summary = await _page(api, api.user, f"/ui/jobs/{job['id']}/summary")
    task_page = await _page(api, api.user, f"/ui/tasks/{task_id}")

    for text in (page, summary):
        assert '<dd id="job-priority">-7</dd>' in text
        assert '<dd id="job-resources">2.5 cpus, 512 MiB</dd>' in text
        assert '<dd id="job-waiting" data-reason="fair_share">2 task(s) not yet placed:' in text
        assert "fair share: 4 tasks of other users ahead" in text
    assert 'name="priority"' in page
    assert 'data-reason="fair_share"><b>fair share</b>: fair share: 4 tasks' in task_page


async def test_a_configuring_jobs_page_offers_its_request_to_edit(api: Api) -> None:
    job = await api.submit(api.user, configuring=True, resources={"cpus": 0.25, "gpus": 1})

    page = await _page(api, api.user, f"/ui/jobs/{job['id']}")
    form = await _page(api, api.user, "/ui/new")

    assert 'name="resources.cpus" data-kind="float"' in page and 'value="0.25"' in page
    assert 'name="resources.gpus" data-kind="int"' in page
    for name in ("resources.cpus", "resources.memory_mb", "resources.gpus", "priority"):
        assert f'name="{name}"' in form


async def test_the_hosts_page_shows_capacity_and_what_is_free(api: Api) -> None:
    host_id = await _live_host(api, 4, 8192, ["0", "1"])
    job = await api.submit(api.user, resources={"cpus": 1.5, "memory_mb": 1024, "gpus": 1})
    await api.pool.execute(
        "UPDATE tasks SET state = 'on_cpu', host = $2, gpu_ids = ARRAY['1'],"
        " claim = gen_random_uuid() WHERE job_id = $1",
        job["id"],
        host_id,
    )

    rows = await _page(api, api.user, "/ui/hosts/rows")
    page = await _page(api, api.user, "/ui/hosts")

    row = rows[rows.index(f'data-host-id="{host_id}"') :].split("</tr>")[0]
    assert '<td class="cpus-free">2.5 of 4</td>' in row
    assert '<td class="memory-free">7168 of 8192 MiB</td>' in row
    assert '<td class="gpus-free">1 of 2 <small class="mono">(0)</small></td>' in row
    assert "<th>CPUs free</th>" in page


async def test_the_users_page_shows_shares_and_usage_with_a_form_to_set_a_share(api: Api) -> None:
    name = api.other.user.name
    await api.pool.execute("UPDATE users SET share = 2.5, usage = 3600.4 WHERE name = $1", name)

    page = await _page(api, api.operator, "/ui/users")

    row = page[page.index(f'data-user="{name}"') :].split("</tr>")[0]
    assert '<span class="share-value">2.5</span>' in row
    assert f'data-method="PATCH" data-path="/admin/users/{name}"' in row
    assert '<td class="usage"' in row and ">3600</td>" in row
