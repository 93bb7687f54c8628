"""Global fixes through the real services: tasks of several jobs that failed for one cause are
selected by state, class and job name and recovered with one `vigil fix`, and run again."""

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

VIGIL = Path(sys.executable).with_name("vigil")


def _vigil(stack: Stack, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "XDG_"))}
    env = kept | {"HOME": str(home), "VIGIL_URL": stack.base_url, "VIGIL_TOKEN": stack.token}
    return subprocess.run([str(VIGIL), *args], env=env, capture_output=True, text=True, timeout=120)


async def _failed_job(
    client: httpx.AsyncClient, events: Events, name: str, command: str
) -> dict[str, Any]:
    response = await client.post("/jobs", json={"name": name, "command": command, "inputs": [1, 2]})
    assert response.status_code == 201, response.text
    job = await wait_job(client, events, response.json()["id"])
    assert job["state"] == "failed"
    return job


async def _ended_twice(events: Events, job_id: str) -> None:
    """Wait for the job's second end (a recovered job is reopened and finishes again)."""
    await events.wait_for(lambda _k, _b: events.finals(job_id) >= 2, within=60)


async def test_when_tasks_of_two_jobs_failed_for_one_cause__one_fix_recovers_them_all(
    stack: Stack,
    client: httpx.AsyncClient,
    events: Events,
    tmp_path: Path,
    shared_dir: Path,
) -> None:
    # given: two jobs whose command fails until a marker exists, and a third one left alone
    marker = shared_dir / "marker"
    command = f"test -e {marker}"
    tag = uuid.uuid4().hex[:8]
    jobs = [await _failed_job(client, events, f"fixme-{tag}-{n}", command) for n in ("a", "b")]
    other = await _failed_job(client, events, f"other-{tag}", command)
    marker.touch()
    options = ["--state", "failed_on_cluster", "--class", "exit", "--job-name", f"fixme-{tag}-*"]

    # when: a dry run, then the fix
    dry = _vigil(stack, tmp_path, "fix", "recover", *options, "--dry-run")
    done = _vigil(stack, tmp_path, "fix", "recover", *options)

    # then: the dry run changed nothing, the fix recovered the four tasks and their jobs end well
    assert dry.returncode == 0, dry.stderr
    assert "4 task(s) in 2 job(s) matched, 4 would change, 0 refused" in dry.stdout
    assert done.returncode == 0, done.stderr
    assert "4 task(s) in 2 job(s) matched, 4 changed, 0 refused" in done.stdout
    for job in jobs:
        await _ended_twice(events, job["id"])
        again = (await client.get(f"/jobs/{job['id']}")).json()
        assert (again["state"], again["counts"]) == ("completed", {"completed": 2})
        for task in (await client.get(f"/jobs/{job['id']}/tasks")).json():
            states = events.task_states(task["id"])
            recovered = states[states.index("recover_cluster") :]
            assert recovered[:3] == ["recover_cluster", "recovering_cluster", "queued"]
            assert recovered[-1] == "completed"
    untouched = (await client.get(f"/jobs/{other['id']}")).json()
    assert (untouched["state"], untouched["counts"]) == ("failed", {"failed_on_cluster": 2})
    listed = _vigil(stack, tmp_path, "fixes", "--limit", "2")
    assert listed.returncode == 0, listed.stderr
    assert "recover (dry run)" in listed.stdout and f"fixme-{tag}-*" in listed.stdout
    [record, dry_record] = (await client.get("/bulk/actions")).json()
    assert (record["dry_run"], record["applied"], record["actor"]) == (False, 4, "operator")
    assert record["finished_at"] is not None and dry_record["dry_run"] is True


async def test_when_completed_tasks_are_restarted_in_bulk__each_runs_again_as_run_2(
    client: httpx.AsyncClient, events: Events
) -> None:
    # given: two completed jobs of one name
    name = f"again-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "command": 'echo "run $VIGIL_RUN_NUMBER"', "inputs": [1, 2]}
    job_ids = []
    for _ in range(2):
        made = await client.post("/jobs", json=body)
        assert made.status_code == 201, made.text
        job_ids.append(made.json()["id"])
    for job_id in job_ids:
        assert (await wait_job(client, events, job_id))["state"] == "completed"
    selector = {"job_name": name, "states": ["completed"]}

    # when
    response = await client.post(
        "/bulk/actions", json={"action": "restart_cluster", "selector": selector}
    )

    # then
    assert response.status_code == 200, response.text
    assert (response.json()["matched"], response.json()["applied"]) == (4, 4)
    for job_id in job_ids:
        await _ended_twice(events, job_id)
        assert (await client.get(f"/jobs/{job_id}")).json()["state"] == "completed"
        run2 = (await client.get(f"/jobs/{job_id}/logs", params={"run": 2})).json()["items"]
        assert sorted(r["line"] for r in run2) == ["run 2", "run 2"]
