"""The shared pool through the `vigil` command against a served api (no scheduler or worker
runs): a request and a priority at submission, `vigil priority`, `vigil why` and
`vigil status` on a waiting job, `vigil users share`, and what `vigil hosts` shows a host has
free."""

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.store import db
from tests.installed_cli import Ran, run_vigil
from tests.integration.test_client import Served, served  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

Vigil = Callable[..., Ran]


@pytest.fixture
def vigil(served: Served, tmp_path: Path) -> Iterator[Vigil]:  # noqa: F811 (the fixture)
    """`vigil(*args, token=None)`: run the command (as the plain user by default) to its end."""
    env = {"VIGIL_URL": served.url, "VIGIL_CONFIG": "/dev/null", "HOME": str(tmp_path)}

    def run(*args: str, token: str | None = None) -> Ran:
        return run_vigil(list(args), env | {"VIGIL_TOKEN": token or served.user_token})

    yield run


def _job_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def _job(served: Served, job_id: str) -> dict[str, Any]:  # noqa: F811 (the fixture)
    with served.client() as client:
        return client.job(job_id)


def _sql(served: Served, statement: str, *args: Any) -> None:  # noqa: F811 (the fixture)
    async def run() -> None:
        async with db.open_pool(served.database_url, max_size=1) as pool, pool.acquire() as conn:
            await conn.execute(statement, *args)

    asyncio.run(run())


def test_submit_sends_the_files_request_and_priority_with_the_flags_in_their_place(
    vigil: Vigil,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    job = _job_file(tmp_path, "command: echo\nresources: {cpus: 2, memory_mb: 1024}\npriority: 3\n")

    from_file = vigil("submit", job)
    with_flags = vigil("submit", job, "--cpus", "0.5", "--gpus", "1", "--priority", "-4")

    assert from_file.exit_code == 0 and with_flags.exit_code == 0, from_file.output
    shown = _job(served, from_file.stdout.strip())
    assert shown["resources"] == {"cpus": 2.0, "memory_mb": 1024, "gpus": 0}
    assert shown["priority"] == 3
    shown = _job(served, with_flags.stdout.strip())
    assert shown["resources"] == {"cpus": 0.5, "memory_mb": 1024, "gpus": 1}
    assert shown["priority"] == -4


def test_a_request_the_api_refuses_is_named_with_exit_1(vigil: Vigil, tmp_path: Path) -> None:
    result = vigil("submit", _job_file(tmp_path, "command: echo\n"), "--cpus", "0")

    assert result.exit_code == 1, result.output
    assert "resources" in result.stderr and "cpus" in result.stderr


def test_vigil_priority_sets_it_within_the_users_range(
    vigil: Vigil,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    job_id = vigil("submit", _job_file(tmp_path, "command: echo\n")).stdout.strip()

    lowered = vigil("priority", job_id, "-7")
    too_high = vigil("priority", job_id, "500")
    by_operator = vigil("priority", job_id, "500", token=served.operator_token)

    assert lowered.exit_code == 0, lowered.output
    assert lowered.stdout == f"job {job_id}: priority -7\n"
    assert too_high.exit_code == 1, too_high.output
    assert "out of range" in too_high.stderr
    assert by_operator.exit_code == 0, by_operator.output
    assert _job(served, job_id)["priority"] == 500


def test_vigil_why_and_status_say_why_a_jobs_tasks_wait_with_the_reasons_numbers(
    vigil: Vigil,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    # given: a job of two tasks needing 2 CPUs each, and the planner's reason for it
    job = _job_file(tmp_path, "command: echo\ninputs: [a, b]\nresources: {cpus: 2}\n")
    job_id = vigil("submit", job).stdout.strip()
    _sql(
        served,
        "INSERT INTO job_waits (job_id, reason, message, detail) VALUES ($1, 'fair_share',"
        " 'fair share: 12 tasks of other users ahead', '{\"ahead\": 12}'::jsonb)",
        job_id,
    )
    task_id = _job_tasks(served, job_id)[0]

    # when
    why_job = vigil("why", job_id)
    why_task = vigil("why", task_id)
    as_json = vigil("why", job_id, "--json")
    status = vigil("status", job_id)

    # then
    assert why_job.exit_code == 0, why_job.output
    assert why_job.stdout.splitlines() == [
        f"job {job_id} is active: 2 new",
        "each task needs 2 cpus",
        "2 task(s) waiting: fair_share: 12 tasks of other users ahead",
        "  ahead: 12",
    ]
    assert why_task.stdout.splitlines() == [
        f"task {task_id} (job {job_id}, index 0) is new, waiting: fair_share:"
        " 12 tasks of other users ahead",
        "  ahead: 12",
    ]
    assert json.loads(as_json.stdout)["waiting"] == {
        "reason": "fair_share",
        "message": "fair share: 12 tasks of other users ahead",
        "detail": {"ahead": 12},
        "tasks": 2,
    }
    shown = " ".join(status.stdout.split())
    assert "resources each task 2 cpus" in shown
    assert "waiting 2 task(s): fair_share: 12 tasks of other users ahead" in shown
    assert "priority" not in shown  # 0: the default


def test_vigil_why_says_a_suspended_jobs_tasks_wait_for_its_resumption(
    vigil: Vigil,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    job_id = vigil("submit", _job_file(tmp_path, "command: echo\ninputs: [a]\n")).stdout.strip()
    assert vigil("suspend", job_id).exit_code == 0
    [task_id] = _job_tasks(served, job_id)

    why_job = vigil("why", job_id)
    why_task = vigil("why", task_id, "--json")

    assert why_job.stdout.splitlines()[-1] == "1 task(s) waiting: suspended: the job is suspended"
    assert json.loads(why_task.stdout)["waiting_reason"]["reason"] == "suspended"


def _job_tasks(served: Served, job_id: str) -> list[str]:  # noqa: F811 (the fixture)
    with served.client() as client:
        return [task["id"] for task in client.tasks(job_id)]


def test_vigil_users_share_sets_a_users_share_and_the_list_shows_it(
    vigil: Vigil,
    served: Served,  # noqa: F811 (the fixture)
) -> None:
    name = f"share-{uuid.uuid4().hex[:8]}"
    assert vigil("add-user", name, token=served.operator_token).exit_code == 0

    shared = vigil("users", "share", name, "2.5", token=served.operator_token)
    listed = vigil("users", token=served.operator_token)
    refused = vigil("users", "share", name, "9")  # a plain user

    assert shared.exit_code == 0, shared.output
    assert shared.stdout == f"user {name}: share 2.5\n"
    header, *rows = (line.split() for line in listed.stdout.splitlines())
    assert header[:4] == ["USER", "ROLE", "SHARE", "USAGE"]
    assert next(row for row in rows if row[0] == name)[1:4] == ["user", "2.5", "0"]
    assert refused.exit_code == 1, refused.output


def test_vigil_hosts_shows_what_a_host_has_free_of_its_capacity(
    vigil: Vigil,
    served: Served,  # noqa: F811 (the fixture)
) -> None:
    host = f"cap-{uuid.uuid4().hex[:8]}"
    _sql(
        served,
        "INSERT INTO hosts (id, slots, heartbeat_at, capacity_millicpus, capacity_memory_mb,"
        " gpu_ids) VALUES ($1, 4, now(), 4000, 8192, '{g0,g1}')",
        host,
    )
    try:
        listed = vigil("hosts")
    finally:
        _sql(served, "DELETE FROM hosts WHERE id = $1", host)

    assert listed.exit_code == 0, listed.output
    [row] = [line.split() for line in listed.stdout.splitlines() if host in line.split()]
    assert row[3:8] == ["4/4", "8", "GiB/8", "GiB", "2/2"]
    assert "2/2 (g0,g1)" in listed.stdout
