"""Hosts hold no credential of the S3 store, on the real services and the real SeaweedFS: the
host's worker and supervisor run without any `AWS_*`, yet a job's objects named by reference
are staged in and its outputs, one of them multipart, staged out through the links the
scheduler signs; the job's command sees no credential either."""

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.objects import open_store
from tests.e2e.conftest import Events, running_stack, wait_job
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

#: Fails (exit 3) if the command sees a credential; else checks its input and makes two
#: outputs, one over a multipart part.
COMMAND = (
    "if env | grep -q '^AWS_'; then echo 'a store credential reached the job' >&2; exit 3; fi\n"
    "sha256sum in.bin\n"
    "cp in.bin copy.bin && head -c 9000000 /dev/urandom > big.bin\n"
)


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str, s3_env: dict[str, str]) -> Iterator[Stack]:
    """The four services on the SeaweedFS, under a prefix of their own (its credentials in
    the environment of the stack: the api's and the scheduler's alone)."""
    store = {name: value for name, value in s3_env.items() if name != "VIGIL_STORE_URL"}
    prefix = f"{s3_env['VIGIL_STORE_URL']}/e2e-{uuid.uuid4().hex[:8]}"
    with running_stack(tmp_path, e2e_namespace, E2E_ENV | store | {"VIGIL_STORE_URL": prefix}) as s:
        yield s


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = [entry.decode(errors="replace").partition("=") for entry in entries if entry]
    return {name: value for name, _, value in pairs}


async def test_a_host_without_credentials_stages_in_and_out_through_signed_links(
    client: httpx.AsyncClient,
    events: Events,
    stack: Stack,
    s3_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: an object in the store, put by the test as an operator would (with credentials)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, s3_env[name])
    url = stack.extra_env["VIGIL_STORE_URL"]
    store = open_store(url, s3_env["VIGIL_S3_ENDPOINT_URL"])
    data = os.urandom(300_000)
    (tmp_path / "in.bin").write_bytes(data)
    info = await store.put_file(f"data/{uuid.uuid4().hex}", tmp_path / "in.bin")
    ref = {"url": f"{url}/{info.key}", "sha256": info.sha256}
    host_env = {name: _environ(stack.procs[name].pid) for name in ("worker", "supervisor")}
    scheduler_env = _environ(stack.procs["scheduler"].pid)

    # when: a job names it and declares outputs
    body = {
        "command": COMMAND,
        "inputs": [{"objects": {"in.bin": ref}}],
        "outputs": ["copy.bin", "big.bin"],
    }
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job = await wait_job(client, events, response.json()["id"], within=90)

    # then: the host held no credential, and the job ran and stored its outputs all the same
    for name, env in host_env.items():
        assert [k for k in env if k.startswith("AWS_")] == [], name
    assert "AWS_SECRET_ACCESS_KEY" in scheduler_env  # the control plane's, which signs
    assert job["state"] == "completed", job
    logs = (await client.get(f"/jobs/{job['id']}/logs")).json()["items"]
    assert [item["line"] for item in logs] == [f"{hashlib.sha256(data).hexdigest()}  in.bin"]
    listed = (await client.get(f"/jobs/{job['id']}/outputs")).json()["items"]
    stored = {o["name"]: o for o in listed}
    assert stored["copy.bin"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert stored["big.bin"]["size"] == 9_000_000
    for output in listed:
        key = f"outputs/{job['id']}/{output['task_id']}/3/{output['name']}"
        head = await store.head(key)
        assert (head.size, head.sha256) == (output["size"], output["sha256"])
