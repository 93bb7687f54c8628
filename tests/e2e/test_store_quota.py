"""A user's quota of stored bytes on the real services: an operator gives it with the installed
`vigil users quota`; a task whose outputs would go over fails, explained (class `quota`,
nothing stored); a user at their quota is refused jobs that declare outputs (409 naming the
bytes); a purge gives the job's bytes back, and the failed task, recovered, then completes."""

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, vigil, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


async def _job(alice: httpx.AsyncClient, events: Events, mib: int) -> tuple[str, dict[str, Any]]:
    """A job of alice's writing one output of `mib` MiB, ended: its id and its task."""
    command = f"head -c {mib * MIB} /dev/zero > out.bin"
    response = await alice.post("/jobs", json={"command": command, "outputs": ["out.bin"]})
    assert response.status_code == 201, response.text
    job_id = str(response.json()["id"])
    await wait_job(alice, events, job_id)
    [task] = (await alice.get(f"/jobs/{job_id}/tasks")).json()
    return job_id, task


async def _stored(client: httpx.AsyncClient, name: str) -> int:
    users = (await client.get("/admin/users")).json()
    return int(next(u for u in users if u["name"] == name)["stored_bytes"])


async def test_outputs_past_a_users_quota_fail_explained__and_a_purge_gives_the_room_back(
    client: httpx.AsyncClient, events: Events, stack: Stack, env: dict[str, str]
) -> None:
    # given: alice, with a quota of 3 MiB given by an operator's command
    name = f"alice-{uuid.uuid4().hex[:6]}"
    made = await client.post("/admin/users", json={"name": name})
    assert made.status_code == 201, made.text
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    given = await asyncio.to_thread(vigil, env, "users", "quota", name, "3M")
    assert given.returncode == 0, given.stderr
    assert given.stdout.strip() == f"user {name}: stores 0 B of 3 MiB"
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as alice:
        # when: she stores 2 MiB, then asks for 2 MiB more, then 1 MiB
        first, _ = await _job(alice, events, 2)
        refused_job, refused = await _job(alice, events, 2)
        kept = list((stack.work_root.parent / "store" / "outputs" / refused_job).rglob("*.bin"))
        _, last = await _job(alice, events, 1)
        full = await alice.post("/jobs", json={"command": "true", "outputs": ["x"]})
        at_quota = await _stored(client, name)
        # and: she purges her first job, then recovers the refused task
        purged = await alice.post(f"/jobs/{first}/actions", json={"action": "purge"})
        await events.wait_key(f"job.purged.{first}")
        after_purge = await _stored(client, name)
        recovered = await alice.post(f"/tasks/{refused['id']}/actions", json={"action": "recover"})
        await events.wait_key(f"job.succeeded.{refused_job}", within=30)
        outputs = (await alice.get(f"/jobs/{refused_job}/outputs")).json()["items"]

    # then: the task over the quota failed, saying so, with nothing stored
    assert (refused["state"], refused["failure_class"]) == ("failed_to_post_process", "quota")
    brief = refused["error_brief"]
    assert f"the outputs of task {refused['id']} (2 MiB, {2 * MIB} bytes)" in brief, brief
    assert f"{name} stores 2 MiB ({2 * MIB} bytes) of a quota of 3 MiB" in brief, brief
    assert "nothing stored" in brief and "then recover the task" in brief
    assert kept == []
    assert last["state"] == "completed"
    # and: at her quota, a job that would store is refused, naming the bytes
    assert at_quota == 3 * MIB
    assert full.status_code == 409, full.text
    assert f"{name} stores 3 MiB ({3 * MIB} bytes) of a quota of 3 MiB" in full.json()["detail"]
    # and: the purge gave its 2 MiB back, and the recovered task stored its outputs
    assert purged.status_code == 202, purged.text
    assert after_purge == 1 * MIB
    assert recovered.status_code == 202, recovered.text
    assert [(o["name"], o["size"]) for o in outputs] == [("out.bin", 2 * MIB)]
    assert await _stored(client, name) == 3 * MIB
