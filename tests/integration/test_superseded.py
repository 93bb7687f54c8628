"""A superseded task is history, not work, on the real database.

A restartable job's task is killed and resubmitted by the real triage (twice, for a lineage of
three): the clones keep the input's index; no action runs a superseded task again (each is
refused naming the last task of the lineage, and writes nothing); the job's counts and failed
tasks are those of the last task of each input; the views show the clone and the decision;
pages by index never split a lineage.
"""

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.domain.actions import SUPERSEDED, JobAction, TaskAction
from shared.domain.errors import Conflict
from shared.domain.states import FailureClass, JobState, TaskState
from shared.operations import configuring, datasets, harvest, task_actions
from shared.operations.configuring import TrialInput
from shared.store import jobs_repo, tasks_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.integration.test_api_harness import Api, running_api
from tests.integration.test_triage import _fail, _host, _triage

pytestmark = pytest.mark.integration

S = TaskState
ACTOR = "ops"
RESTARTABLE = {"restartable": True, "backoff": {"initial_s": 0.1, "max_s": 0.2}}


@dataclass(frozen=True)
class Lineage:
    """A job of three inputs whose input 1 was killed and resubmitted (`tasks` of the input,
    oldest first); the other inputs' tasks in `others`."""

    job_id: str
    tasks: list[str]
    others: list[str]

    @property
    def latest(self) -> str:
        return self.tasks[-1]


async def _user_id(conn: Connection) -> str:
    user = await users_repo.ensure_user(
        conn, f"u-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    return user.id


async def _resubmitted(
    pool: Pool, conn: Connection, *, times: int = 1, owner_id: str | None = None
) -> Lineage:
    """Given-step: a restartable job of inputs a, b, c; b's task killed by a signal and
    resubmitted by the triage `times` times (each clone killed in turn); every other task,
    and the last clone, completed; the job ended by the finaliser's statement."""
    owner = owner_id or await _user_id(conn)
    job, _ = await jobs_repo.create(
        conn, owner, NewJob("r", "shell", "true", ["a", "b", "c"], policy=RESTARTABLE)
    )
    first, killed, third = await datasets.task_ids_of(conn, job.id)
    host = await _host(conn)
    lineage_ids = [killed]
    for _ in range(times):
        await _fail(conn, lineage_ids[-1], FailureClass.SIGNAL, host)
        await _triage(pool).run_once()
        task = await tasks_repo.get(conn, lineage_ids[-1])
        assert task is not None and task.superseded_by is not None, "the triage resubmits it"
        lineage_ids.append(task.superseded_by)
    for task_id in (first, third, lineage_ids[-1]):
        await conn.execute(
            "UPDATE tasks SET state = 'completed', claim = NULL WHERE id = $1", task_id
        )
    ended, _ = await jobs_repo.end_finished(conn, [job.id])
    assert ended == {job.id: JobState.COMPLETED}
    return Lineage(job.id, lineage_ids, [first, third])


async def _snapshot(conn: Connection, job_id: str) -> tuple[Any, ...]:
    """What an action could change: the job's tasks (id, state, run), its outbox rows, its
    state."""
    tasks = await conn.fetch(
        "SELECT id, state::text, run_number, claim FROM tasks WHERE job_id = $1 ORDER BY id",
        job_id,
    )
    outbox = await conn.fetchval(
        "SELECT count(*) FROM outbox WHERE body->>'job_id' = $1 OR routing_key LIKE $2",
        job_id,
        f"%.{job_id}",
    )
    state = await conn.fetchval("SELECT state::text FROM jobs WHERE id = $1", job_id)
    return [tuple(r) for r in tasks], outbox, state


# -- the index names the input, the lineage the try ---------------------------------------------


async def test_a_clone_keeps_its_inputs_index_and_a_new_input_gets_the_next_one(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given input b (index 1) resubmitted twice
        found = await _resubmitted(pool, conn, times=2)

        # when an input is appended
        [appended] = await datasets.add_inputs(conn, found.job_id, ["d"])

        # then the lineage shares b's index, and the new input takes the next free one
        tasks = {t.id: t for t in await tasks_repo.list_for_job(conn, found.job_id)}
        assert [tasks[t].index for t in found.tasks] == [1, 1, 1]
        assert [tasks[t].input for t in found.tasks] == ["b", "b", "b"]
        assert tasks[appended].index == 3
        ordered = [t.id for t in await tasks_repo.list_for_job(conn, found.job_id)]
        assert ordered == [found.others[0], *found.tasks, found.others[1], appended]


async def test_a_task_already_resubmitted_is_not_cloned_again_under_its_index(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        found = await _resubmitted(pool, conn)
        # the key refuses a second clone of one task even past the lineage's own check
        await conn.execute("UPDATE tasks SET superseded_by = NULL WHERE id = $1", found.tasks[0])
        with pytest.raises(Exception, match="tasks_job_id_index_lineage_key"):
            await jobs_repo.add_clone(conn, found.job_id, found.tasks[0])


async def test_the_last_of_a_lineage_is_found_from_any_of_its_tasks(pool: Pool) -> None:
    async with pool.acquire() as conn:
        found = await _resubmitted(pool, conn, times=2)
        for task_id in found.tasks:
            latest = await tasks_repo.latest_of_lineage(conn, task_id)
            assert latest is not None and latest.id == found.latest


# -- no action runs a superseded task again ----------------------------------------------------


@pytest.mark.parametrize("action", list(TaskAction))
@pytest.mark.parametrize("which", [0, 1])
async def test_every_action_on_a_superseded_task_is_refused_naming_the_last_of_its_lineage(
    pool: Pool, action: TaskAction, which: int
) -> None:
    async with pool.acquire() as conn:
        # given b killed, resubmitted twice, its last clone completed (the job completed)
        found = await _resubmitted(pool, conn, times=2)
        before = await _snapshot(conn, found.job_id)

        # when an action is asked of the original, or of the clone in the middle
        with pytest.raises(Conflict) as refused:
            await task_actions.apply_to_task(conn, found.tasks[which], action, ACTOR)

        # then it is refused (cancel by the state table: a superseded task rests failed),
        # naming the task that carries the input on, and nothing is written
        if action is not TaskAction.CANCEL:
            assert refused.value.refusal.why == (
                f"cannot {action.value} task {found.tasks[which]}: it was resubmitted, and its"
                f" input runs on as task {found.latest} (completed)"
            )
            assert f"act on {found.latest} instead" in refused.value.refusal.next_step
        assert await _snapshot(conn, found.job_id) == before


@pytest.mark.parametrize(
    "action",
    [TaskAction.RESTART_SETUP, TaskAction.RESTART_CLUSTER, TaskAction.RESTART_POST_PROCESSING],
)
async def test_a_superseded_task_that_completed_anyway_is_not_restarted(
    pool: Pool, action: TaskAction
) -> None:
    async with pool.acquire() as conn:
        # given the newcomer's job: the original recovered before this fix, and completed too
        found = await _resubmitted(pool, conn)
        await conn.execute("UPDATE tasks SET state = 'completed' WHERE id = $1", found.tasks[0])
        before = await _snapshot(conn, found.job_id)

        with pytest.raises(Conflict, match=f"runs on as task {found.latest}"):
            await task_actions.apply_to_task(conn, found.tasks[0], action, ACTOR)

        assert await _snapshot(conn, found.job_id) == before


async def test_recovering_a_job_leaves_its_superseded_tasks_and_recovers_the_last_clone(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given b's last clone failed for good (the job failed), after two resubmissions
        found = await _resubmitted(pool, conn, times=2)
        await conn.execute(
            "UPDATE tasks SET state = 'failed_on_cluster', failure_class = 'exit' WHERE id = $1",
            found.latest,
        )
        await conn.execute("UPDATE jobs SET state = 'failed' WHERE id = $1", found.job_id)

        await task_actions.apply_to_job(conn, found.job_id, JobAction.RECOVER_FAILED, ACTOR)

        tasks = {t.id: t.state for t in await tasks_repo.list_for_job(conn, found.job_id)}
        assert [tasks[t] for t in found.tasks] == [
            S.FAILED_ON_CLUSTER,
            S.FAILED_ON_CLUSTER,
            S.RECOVER_CLUSTER,
        ]


# -- what the job shows: the last task of each input ------------------------------------------


async def test_the_jobs_counts_are_its_inputs_and_its_superseded_tasks_are_counted_apart(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        found = await _resubmitted(pool, conn, times=2)

        job = await jobs_repo.get(conn, found.job_id)

        assert job is not None
        assert (job.state, job.counts, job.superseded) == (
            JobState.COMPLETED,
            {"completed": 3},
            2,
        )


async def test_a_page_by_index_holds_each_index_whole_and_the_next_misses_none(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        found = await _resubmitted(pool, conn, times=2)

        first = await tasks_repo.page_for_job(conn, found.job_id, after=None, limit=2)
        second = await tasks_repo.page_for_job(conn, found.job_id, after=1, limit=2)
        failed = await tasks_repo.page_for_job(
            conn, found.job_id, after=None, limit=1, states=[S.FAILED_ON_CLUSTER]
        )

        assert [t.id for t in first] == [found.others[0], *found.tasks]
        assert [t.id for t in second] == [found.others[1]]
        assert [t.id for t in failed] == found.tasks[:2]
        cut, last = tasks_repo.first_indexes(first, 1)
        assert ([t.id for t in cut], last) == ([found.others[0]], 0)


async def test_a_job_chained_after_a_resubmission_takes_the_last_task_of_each_input(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        found = await _resubmitted(pool, conn)
        upstream = await datasets.upstream_task_ids(conn, found.job_id)
        assert upstream == [found.others[0], found.latest, found.others[1]]

        # and a test of a configuring job chained from it runs on the input at that position
        owner = await _user_id(conn)
        chained, _ = await jobs_repo.create(
            conn,
            owner,
            NewJob("c", "shell", "true", [], inputs_from=found.job_id, configuring=True),
        )
        test = await configuring.start_test(conn, chained.id, TrialInput(index=1))
        assert test.input == {datasets.UPSTREAM_KEY: found.latest}


async def test_a_purge_in_batches_reaches_every_task_of_an_index(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with pool.acquire() as conn:
        found = await _resubmitted(pool, conn, times=2)
        await conn.execute(
            "UPDATE tasks SET host = 'h-purge', workdir = '/w/' || id WHERE job_id = $1",
            found.job_id,
        )
        monkeypatch.setattr(harvest, "PURGE_TASK_BATCH", 2)

        await harvest.purge_job(conn, found.job_id, ACTOR, "test")

        rows = await conn.fetch(
            "SELECT body FROM outbox WHERE routing_key = 'host.h-purge' AND body->>'job_id' = $1",
            found.job_id,
        )
        removed = sorted(t for r in rows for t in r["body"]["task_ids"])
        assert removed == sorted([*found.others, *found.tasks])


# -- the api ---------------------------------------------------------------------------------


@pytest.fixture
async def api(session_database_url: str) -> AsyncIterator[Api]:
    async with running_api(session_database_url) as running:
        yield running


async def _api_lineage(api: Api, times: int = 1) -> Lineage:
    async with api.pool.acquire() as conn:
        return await _resubmitted(api.pool, conn, times=times, owner_id=api.user.user.id)


@pytest.mark.parametrize(
    "action",
    ["recover", "restart_setup", "restart_cluster", "restart_post_processing", "duplicate"],
)
async def test_an_action_on_a_superseded_task_is_a_409_naming_its_clone(
    api: Api, action: str
) -> None:
    found = await _api_lineage(api, times=2)

    response = await api.client.post(
        f"/tasks/{found.tasks[0]}/actions", json={"action": action}, headers=api.user.headers
    )

    assert response.status_code == 409, response.text
    body = response.json()
    assert f"its input runs on as task {found.latest} (completed)" in body["detail"]
    assert body["next_step"].startswith(f"act on {found.latest} instead")
    job = (await api.client.get(f"/jobs/{found.job_id}", headers=api.user.headers)).json()
    assert (job["state"], job["counts"], job["superseded"]) == ("completed", {"completed": 3}, 2)


async def test_the_views_show_the_clone_the_decision_and_the_counts_of_the_inputs(
    api: Api,
) -> None:
    found = await _api_lineage(api)
    headers = api.user.headers

    task = (await api.client.get(f"/tasks/{found.tasks[0]}", headers=headers)).json()
    job = (await api.client.get(f"/jobs/{found.job_id}", headers=headers)).json()
    listed = (await api.client.get("/jobs", params={"limit": 1}, headers=headers)).json()
    page = await api.client.get(
        f"/jobs/{found.job_id}/tasks", params={"after": 0, "limit": 1}, headers=headers
    )

    assert (task["superseded_by"], task["decision"]) == (found.latest, "resubmitted")
    assert "signal: resubmitted (1/3)" in task["decision_reason"]
    assert (job["counts"], job["superseded"]) == ({"completed": 3}, 1)
    assert (listed["items"][0]["counts"], listed["items"][0]["superseded"]) == (
        {"completed": 3},
        1,
    )
    rows = page.json()
    assert [(t["id"], t["index"], t["superseded_by"]) for t in rows] == [
        (found.tasks[0], 1, found.latest),
        (found.latest, 1, None),
    ]
    assert rows[0]["decision"] == "resubmitted" and rows[1]["decision"] is None
    assert "after=1&limit=1" in page.headers["Link"]


async def test_a_global_fix_refuses_superseded_tasks_and_counts_why(api: Api) -> None:
    found = await _api_lineage(api)
    body = {
        "action": "recover",
        "selector": {"job_ids": [found.job_id], "include_superseded": True},
    }
    before = await api.pool.fetchval("SELECT state::text FROM tasks WHERE id = $1", found.tasks[0])

    dry = await api.client.post(
        "/bulk/actions", json=body | {"dry_run": True}, headers=api.operator.headers
    )
    done = await api.client.post("/bulk/actions", json=body, headers=api.operator.headers)

    for response in (dry, done):
        assert response.status_code == 200, response.text
        record = response.json()
        assert record["refusals"].get(SUPERSEDED) == 1, record
    assert done.json()["applied"] == 0
    after = await api.pool.fetchval("SELECT state::text FROM tasks WHERE id = $1", found.tasks[0])
    assert before == after == "failed_on_cluster"
