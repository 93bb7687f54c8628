"""Harvest and cleanup on the real services: outputs listed and downloaded after a job ran
(from the object store, whatever their size), a purge removing the work dirs from disk, the
logs and the stored outputs, and retention purging a job on its own.
"""

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, vigil, wait_job
from tests.e2e.stack import Stack
from vigil import Client

pytestmark = pytest.mark.e2e

#: Writes a small output and one over the 1 MiB that PostgreSQL keeps for chained tasks.
COMMAND = 'printf "result of %s\\n" "$VIGIL_INPUT" > out.txt && head -c 1048577 /dev/zero > big.bin'


async def _completed(client: httpx.AsyncClient, events: Events, **body: Any) -> str:
    response = await client.post(
        "/jobs", json={"command": COMMAND, "outputs": ["out.txt", "big.bin"]} | body
    )
    assert response.status_code == 201, response.text
    job_id = str(response.json()["id"])
    assert (await wait_job(client, events, job_id))["state"] == "completed"
    return job_id


async def _wait_gone(path: Path, within: float = 20.0) -> None:
    """Return once `path` no longer exists (a worker removes it; no event says when)."""
    async with asyncio.timeout(within):
        while await asyncio.to_thread(path.exists):  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.05)


async def test_when_a_job_wrote_outputs__they_are_listed_and_each_downloads_whole(
    client: httpx.AsyncClient, events: Events, stack: Stack
) -> None:
    job_id = await _completed(client, events, inputs=["a"])

    listed = (await client.get(f"/jobs/{job_id}/outputs")).json()["items"]
    small = await client.get(f"/tasks/{listed[0]['task_id']}/outputs/out.txt")
    big = await client.get(f"/tasks/{listed[0]['task_id']}/outputs/big.bin")

    assert [(o["name"], o["size"], o["downloadable"]) for o in listed] == [
        ("big.bin", 1048577, True),
        ("out.txt", 12, True),
    ]
    assert small.status_code == 200
    assert small.content == b"result of a\n"
    assert hashlib.sha256(small.content).hexdigest() == listed[1]["sha256"]
    assert big.status_code == 200
    assert big.content == bytes(1048577)
    assert hashlib.sha256(big.content).hexdigest() == listed[0]["sha256"]


async def test_when_a_finished_job_is_purged__its_work_dirs_and_logs_are_gone(
    client: httpx.AsyncClient, events: Events, stack: Stack
) -> None:
    job_id = await _completed(client, events, inputs=["a", "b"], command=f"echo hi && {COMMAND}")
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    workdirs = [Path(t["workdir"]) for t in tasks]
    assert all(w.is_dir() for w in workdirs)
    assert (await client.get(f"/jobs/{job_id}/logs")).json()["items"]
    stored = stack.work_root.parent / "store" / "outputs" / job_id  # the stack's directory store
    assert len([p for p in stored.rglob("*") if p.is_file()]) == 4

    response = await client.post(f"/jobs/{job_id}/actions", json={"action": "purge"})

    assert response.status_code == 202, response.text
    await events.wait_key(f"job.purged.{job_id}")
    for workdir in workdirs:
        await _wait_gone(workdir)
    await _wait_gone(stack.work_root / job_id)  # the job's dir goes right after its tasks'
    assert (await client.get(f"/jobs/{job_id}/logs")).json()["items"] == []
    assert [p for p in stored.rglob("*") if p.is_file()] == []
    download = await client.get(f"/tasks/{tasks[0]['id']}/outputs/out.txt")
    assert download.status_code == 409
    again = await client.post(f"/jobs/{job_id}/inputs", json={"inputs": ["c"]})
    assert again.status_code == 409
    assert "was purged at" in again.json()["detail"]


async def test_when_a_job_has_a_short_retention__the_scheduler_purges_it_on_its_own(
    client: httpx.AsyncClient, events: Events
) -> None:
    job_id = await _completed(client, events, retention_s=1)
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()

    event = await events.wait_key(f"job.purged.{job_id}", within=30)

    assert event["brief"] == "purged by retention: retention: 1 s after the job ended"
    await _wait_gone(Path(task["workdir"]))
    job = (await client.get(f"/jobs/{job_id}")).json()
    assert (job["purged_by"], job["retention_s"]) == ("retention", 1)


def test_when_the_cli_harvests__it_lists_saves_and_purges(
    stack: Stack, env: dict[str, str], tmp_path: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"command: '{COMMAND}'\noutputs: [out.txt, big.bin]\ninputs: [cli]\n")
    submitted = vigil(env, "submit", str(job_file), "--wait")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    with Client(stack.base_url, stack.token) as client:
        [task] = client.tasks(job_id)

    listed = vigil(env, "outputs", job_id)
    # a download of the whole job that was cut after 1000 bytes of big.bin
    to = tmp_path / "all"
    (to / task["id"]).mkdir(parents=True)
    (to / task["id"] / "big.bin.part").write_bytes(bytes(1000))
    everything = vigil(env, "download", job_id, "--to", str(to))
    saved = vigil(env, "download", task["id"], "out.txt", "-o", str(tmp_path / "got.txt"))
    big = vigil(env, "download", task["id"], "big.bin", "-o", str(tmp_path / "big.bin"))
    purged = vigil(env, "purge", job_id, "--yes")

    assert listed.returncode == 0, listed.stderr
    assert "out.txt" in listed.stdout and "big.bin" in listed.stdout
    assert saved.returncode == 0, saved.stderr
    assert (tmp_path / "got.txt").read_bytes() == b"result of cli\n"
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout == f"saved 2 outputs ({1048577 + 14} bytes) to {to}\n"
    assert f"{task['id']}/big.bin: resumed from byte 1000" in everything.stderr
    assert sorted(p.name for p in (to / task["id"]).iterdir()) == ["big.bin", "out.txt"]
    assert (to / task["id"] / "big.bin").read_bytes() == bytes(1048577)
    assert (to / task["id"] / "out.txt").read_bytes() == b"result of cli\n"
    assert big.returncode == 0, big.stderr
    assert (tmp_path / "big.bin").read_bytes() == bytes(1048577)
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.startswith(f"job {job_id}: purged at ")
