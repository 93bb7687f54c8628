"""Error detail is for operators: users saw the worker's tracebacks, with the servers' paths,
in `error_detail`. A user now gets the brief only; operators see the detail."""

from collections.abc import AsyncIterator

import pytest

from tests.integration.test_api_harness import Api, running_api

pytestmark = pytest.mark.integration

TRACEBACK = 'Traceback (most recent call last):\n  File "/srv/vigil/services/worker/stages.py"'


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def test_a_user_sees_the_brief_of_a_failure_and_an_operator_its_detail(api: Api) -> None:
    job = await api.submit(api.user)
    [task] = (await api.client.get(f"/jobs/{job['id']}/tasks", headers=api.user.headers)).json()
    await api.pool.execute(
        "UPDATE tasks SET error_brief = 'worker error: OSError: disk full', error_detail = $2"
        " WHERE id = $1",
        task["id"],
        TRACEBACK,
    )
    await api.pool.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, error_brief, error_detail)"
        " VALUES ($1, 1, 1, 'setup', 'worker error: OSError: disk full', $2)",
        task["id"],
        TRACEBACK,
    )

    views = {
        who: [
            (await api.client.get(f"/tasks/{task['id']}", headers=caller.headers)).json(),
            (await api.client.get(f"/jobs/{job['id']}/tasks", headers=caller.headers)).json()[0],
        ]
        for who, caller in (("user", api.user), ("operator", api.operator))
    }

    for view in views["user"]:
        assert (view["error_brief"], view["error_detail"]) == (
            "worker error: OSError: disk full",
            None,
        )
    assert views["user"][0]["attempts"][0]["error_detail"] is None
    for view in views["operator"]:
        assert view["error_detail"] == TRACEBACK
    assert views["operator"][0]["attempts"][0]["error_detail"] == TRACEBACK
