"""Stage-in on the real services, as a user's client does it: a job's file and an input's
object named by reference to the stack's object store, read by confined jobs, read-only; an
object whose bytes are not the ones named fails its task saying so, and the others run."""

import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from shared.objects import open_store
from shared.store import users_repo
from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture
async def user(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    token = uuid.uuid4().hex
    conn = await asyncpg.connect(stack.database_url)
    try:
        await users_repo.ensure_user(conn, f"user-{token[:8]}", "user", token)
    finally:
        await conn.close()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as c:
        yield c


async def _shared(stack: Stack, tmp_path: Path, data: bytes) -> dict[str, str]:
    """An object of the stack's store, as an operator puts a site's data there."""
    url = (stack.work_root.parent / "store").as_uri()
    store = open_store(url)
    source = tmp_path / uuid.uuid4().hex
    source.write_bytes(data)
    info = await store.put_file(f"data/{uuid.uuid4().hex}", source)
    await store.close()
    return {"url": f"{url}/{info.key}", "sha256": hashlib.sha256(data).hexdigest()}


async def test_objects_named_by_reference_are_staged_read_only_and_checked(
    stack: Stack, user: httpx.AsyncClient, events: Events, tmp_path: Path
) -> None:
    genome = await _shared(stack, tmp_path, b">chr1\nACGT\n" * 50_000)
    reads = await _shared(stack, tmp_path, b"@r1\nACGT\n+\nIIII\n")
    lying = {"url": reads["url"], "sha256": "0" * 64}
    command = (
        "sha256sum ref/genome.fa reads.fq\n"
        "if { echo x >> ref/genome.fa; } 2>/dev/null; then echo changed; else echo read-only; fi"
    )
    body = {
        "command": command,
        "files": {"ref/genome.fa": genome},
        "inputs": [{"objects": {"reads.fq": reads}}, {"objects": {"reads.fq": lying}}],
    }

    answer = await user.post("/jobs", json=body)
    assert answer.status_code == 201, answer.text
    job = await wait_job(user, events, answer.json()["id"])

    tasks = (await user.get(f"/jobs/{job['id']}/tasks")).json()
    good, bad = sorted(tasks, key=lambda t: t["index"])
    assert good["state"] == "completed", good
    logs = await user.get(f"/jobs/{job['id']}/logs", params={"task": good["id"]})
    lines = logs.json()["items"]
    assert [item["line"] for item in lines] == [
        f"{genome['sha256']}  ref/genome.fa",
        f"{reads['sha256']}  reads.fq",
        "read-only",
    ]
    assert (bad["state"], bad["failure_class"]) == ("failed_to_setup", "checksum"), bad
    assert bad["error_brief"] == (
        f"object reads.fq ({reads['url']}) is not the one named: its bytes have sha256"
        f" {reads['sha256']}, not {'0' * 64}"
    )
