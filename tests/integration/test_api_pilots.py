"""`/pilots` on the real database: operators ask for pilots and withdraw them,
anyone signed in lists them. No scheduler runs here: the rows stay as the api wrote them
(a test that needs a submitted pilot sets its batch state with SQL)."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    # a pool of its own: a scheduler of another test on this database never sees these pilots
    pool = f"pilots-{uuid.uuid4().hex[:8]}"
    async with running_api(session_database_url, pilots_backend="slurm", worker_pool=pool) as a:
        yield a


async def _ask(api: Api, **body: Any) -> list[dict[str, Any]]:
    """Given-step: an operator's `POST /pilots` (201 asserted); the pilots made."""
    response = await api.client.post("/pilots", json=body, headers=api.operator.headers)
    assert response.status_code == 201, response.text
    made: list[dict[str, Any]] = response.json()
    return made


async def _listed(api: Api, **query: Any) -> list[str]:
    """The ids `GET /pilots` lists (a user's call), in its order."""
    response = await api.client.get("/pilots", params=query, headers=api.user.headers)
    assert response.status_code == 200, response.text
    return [p["id"] for p in response.json()]


async def test_when_an_operator_asks_for_pilots__count_rows_are_requested_with_the_sizes(
    api: Api,
) -> None:
    made = await _ask(api, count=3, cpus=4, memory_mb=2048, gpus=1, walltime_s=1800)

    assert len(made) == 3 and len({p["id"] for p in made}) == 3
    for pilot in made:
        assert pilot["id"].startswith("p-")
        assert pilot["state"] == "requested"
        assert (pilot["cpus"], pilot["memory_mb"], pilot["gpus"]) == (4, 2048, 1)
        assert pilot["walltime_s"] == 1800
        assert pilot["requested_by"] == api.operator.user.name
        assert (pilot["pool"], pilot["backend"]) == (api.settings.worker_pool, "slurm")
        assert pilot["batch_job_id"] is None and pilot["host_id"] is None
    rows = await api.pool.fetch(
        "SELECT state, cpus, memory_mb, gpus, walltime_s, requested_by FROM pilots"
        " WHERE id = ANY($1::text[])",
        [p["id"] for p in made],
    )
    assert [tuple(r) for r in rows] == [("requested", 4, 2048, 1, 1800, api.operator.user.name)] * 3


async def test_defaults__one_pilot_of_one_cpu_for_an_hour(api: Api) -> None:
    [pilot] = await _ask(api)
    assert (pilot["cpus"], pilot["memory_mb"], pilot["gpus"], pilot["walltime_s"]) == (
        1,
        None,
        0,
        3600,
    )


async def test_when_a_user_asks_for_or_withdraws_a_pilot__403_and_nothing_is_written(
    api: Api,
) -> None:
    [pilot] = await _ask(api)
    before = await api.pool.fetchval("SELECT count(*) FROM pilots")

    asked = await api.client.post("/pilots", json={"count": 2}, headers=api.user.headers)
    withdrawn = await api.client.delete(f"/pilots/{pilot['id']}", headers=api.user.headers)

    assert asked.status_code == 403, asked.text
    assert withdrawn.status_code == 403, withdrawn.text
    assert await api.pool.fetchval("SELECT count(*) FROM pilots") == before
    state = await api.pool.fetchval("SELECT state FROM pilots WHERE id = $1", pilot["id"])
    assert state == "requested"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        pytest.param({"count": 0}, "count", "greater than or equal to 1", id="count-0"),
        pytest.param({"count": 101}, "count", "less than or equal to 100", id="count-101"),
        pytest.param({"walltime_s": 10}, "walltime_s", "greater than or equal to 60", id="wall-10"),
        pytest.param({"cpus": 0}, "cpus", "greater than or equal to 1", id="cpus-0"),
        pytest.param({"gpus": -1}, "gpus", "greater than or equal to 0", id="gpus-negative"),
        pytest.param({"count": "two"}, "count", "valid integer", id="count-text"),
        pytest.param({"colour": "red"}, "colour", "Extra inputs", id="unknown-field"),
    ],
)
async def test_when_the_body_is_invalid__422_naming_the_field_and_nothing_is_written(
    api: Api, body: dict[str, Any], field: str, words: str
) -> None:
    before = await api.pool.fetchval("SELECT count(*) FROM pilots")

    response = await api.client.post("/pilots", json=body, headers=api.operator.headers)

    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    matching = [e for e in detail if e["loc"] == ["body", field]]
    assert matching, detail
    assert any(words in e["msg"] for e in matching), detail
    assert await api.pool.fetchval("SELECT count(*) FROM pilots") == before


async def test_without_a_batch_system__409_with_the_next_step(session_database_url: str) -> None:
    async with running_api(session_database_url) as api:
        assert api.settings.pilots_backend == "none"
        before = await api.pool.fetchval("SELECT count(*) FROM pilots")

        response = await api.client.post("/pilots", json={}, headers=api.operator.headers)

        assert response.status_code == 409, response.text
        assert "VIGIL_PILOTS_BACKEND=slurm" in response.json()["next_step"]
        assert "no batch system" in response.json()["detail"]
        assert await api.pool.fetchval("SELECT count(*) FROM pilots") == before


async def test_the_list_is_newest_first_and_live_leaves_the_ended_ones_out(api: Api) -> None:
    [oldest] = await _ask(api)
    [middle] = await _ask(api)
    [newest] = await _ask(api)
    # created a second apart (one transaction's now() could tie them), the middle one ended
    for age, pilot in ((3, oldest), (2, middle), (1, newest)):
        await api.pool.execute(
            "UPDATE pilots SET created_at = now() - make_interval(secs => $2) WHERE id = $1",
            pilot["id"],
            age,
        )
    await api.pool.execute(
        "UPDATE pilots SET state = 'ended', ended_at = now(), reason = 'walltime' WHERE id = $1",
        middle["id"],
    )
    ours = {oldest["id"], middle["id"], newest["id"]}

    every = [i for i in await _listed(api) if i in ours]
    live = [i for i in await _listed(api, live="true") if i in ours]

    assert every == [newest["id"], middle["id"], oldest["id"]]
    assert live == [newest["id"], oldest["id"]]


async def test_without_a_token__401(api: Api) -> None:
    assert (await api.client.get("/pilots")).status_code == 401
    assert (await api.client.post("/pilots", json={})).status_code == 401


async def test_when_a_requested_pilot_is_withdrawn__it_ends_at_once(api: Api) -> None:
    [pilot] = await _ask(api)

    response = await api.client.delete(f"/pilots/{pilot['id']}", headers=api.operator.headers)

    assert response.status_code == 202, response.text
    shown = response.json()
    assert shown["state"] == "ended"
    assert shown["reason"] == f"cancelled by {api.operator.user.name}"
    assert shown["ended_at"] is not None
    row = await api.pool.fetchrow("SELECT state, reason FROM pilots WHERE id = $1", pilot["id"])
    assert row is not None and tuple(row) == ("ended", f"cancelled by {api.operator.user.name}")
    # withdrawing it again changes nothing: it is returned as it is
    again = await api.client.delete(f"/pilots/{pilot['id']}", headers=api.operator.headers)
    assert again.status_code == 202
    assert (again.json()["state"], again.json()["ended_at"]) == ("ended", shown["ended_at"])


async def test_when_a_pending_pilot_is_withdrawn__it_drains_for_the_scheduler_to_cancel(
    api: Api,
) -> None:
    [pilot] = await _ask(api)
    batch_job = str(uuid.uuid4().int % 10**9)  # unique per (backend, batch job)
    await api.pool.execute(
        "UPDATE pilots SET state = 'pending', batch_job_id = $2, reason = 'Resources'"
        " WHERE id = $1",
        pilot["id"],
        batch_job,
    )

    response = await api.client.delete(f"/pilots/{pilot['id']}", headers=api.operator.headers)

    assert response.status_code == 202, response.text
    shown = response.json()
    assert (shown["state"], shown["batch_job_id"]) == ("draining", batch_job)
    assert shown["reason"] == f"cancelled by {api.operator.user.name}"
    assert shown["ended_at"] is None
    live = await _listed(api, live="true")
    assert pilot["id"] in live


async def test_when_the_pilot_is_unknown__404_and_when_its_id_is_malformed__422(
    api: Api,
) -> None:
    ops = api.operator.headers

    missing = await api.client.delete("/pilots/p-nowhere", headers=ops)
    malformed = await api.client.delete("/pilots/Not%20An%20Id", headers=ops)

    assert missing.status_code == 404, missing.text
    assert "p-nowhere" in missing.json()["detail"]
    assert malformed.status_code == 422, malformed.text
    [error] = malformed.json()["detail"]
    assert error["loc"] == ["path", "pilot_id"]
    assert "not a valid id" in error["msg"]
