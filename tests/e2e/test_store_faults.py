"""The object store failing under a campaign, on the real services and the real SeaweedFS of
`scripts/s3`: tasks wait for it in post-processing and retry, none fails as the job's fault,
none completes without its outputs; when it comes back, every task completes and the installed
`vigil download` fetches every output through the store's short-lived links. A job's command
sees none of the store's credentials. A host killed while it puts an output leaves no partial
object, and what is recorded is the rerun's."""

import asyncio
import hashlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.objects import open_store
from tests.e2e.conftest import Events, running_stack, vigil, wait_job
from tests.e2e.stack import E2E_ENV, Stack
from tests.s3_fixture import own_s3, s3_script

pytestmark = pytest.mark.e2e

TASKS = 20
#: A 5 MB output, made only if the command sees no credential of the store.
COMMAND = (
    "if env | grep -q '^AWS_'; then echo 'the store credentials reached the job' >&2; exit 3; fi;"
    " head -c 5000000 /dev/urandom > out.bin"
)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this module's own SeaweedFS keeps its data, keys, ports and pid file."""
    return tmp_path_factory.mktemp("s3-faults")


@pytest.fixture(scope="module")
def store_env(store_dir: Path) -> Iterator[dict[str, str]]:
    """A SeaweedFS of this module's own: these tests kill it, and the session's store, which
    the other tests use, never goes down."""
    with own_s3(store_dir) as env:
        yield env


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str, store_env: dict[str, str]) -> Iterator[Stack]:
    """The four services keeping outputs in the module's SeaweedFS, under a prefix of their own."""
    store = {name: value for name, value in store_env.items() if name != "VIGIL_STORE_URL"}
    prefix = f"{store_env['VIGIL_STORE_URL']}/e2e-{uuid.uuid4().hex[:8]}"
    env = E2E_ENV | store | {"VIGIL_STORE_URL": prefix, "VIGIL_STORE_PATIENCE_S": "300"}
    with running_stack(tmp_path, e2e_namespace, env) as s:
        yield s


def _kill_the_store(store_dir: Path) -> None:
    """SIGKILL the module's SeaweedFS (its pid file), as a crash or a pulled plug."""
    os.kill(int((store_dir / "weed.pid").read_text()), signal.SIGKILL)


async def _tasks(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/jobs/{job_id}/tasks", params={"limit": 100})
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()
    return tasks


async def _until_waiting_on_the_store(
    client: httpx.AsyncClient, job_id: str, within: float = 60.0
) -> list[dict[str, Any]]:
    """The job's tasks once every command has run and its task waits in post-processing
    (polled: no event says that a put failed)."""
    async with asyncio.timeout(within):
        while True:
            tasks = await _tasks(client, job_id)
            if all(t["state"] == "post_processing" for t in tasks):
                return tasks
            await asyncio.sleep(0.2)  # no event says that a put failed


#: Bounds: the commands' end (60 s), the campaign's end once the store is back (120 s), the
#: download (180 s), and the store's own restart.
@pytest.mark.timeout(480)
async def test_a_store_that_goes_away_mid_campaign_delays_the_tasks_and_loses_nothing(
    client: httpx.AsyncClient,
    events: Events,
    stack: Stack,
    env: dict[str, str],
    tmp_path: Path,
    store_dir: Path,
    store_env: dict[str, str],
) -> None:
    # given: the store is gone when the campaign's commands end
    _kill_the_store(store_dir)
    try:
        body = {"command": COMMAND, "inputs": list(range(TASKS)), "outputs": ["out.bin"]}
        response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]

        waiting = await _until_waiting_on_the_store(client, job_id)

        assert len(waiting) == TASKS  # none completed without its output, none failed
        listed = (await client.get(f"/jobs/{job_id}/outputs")).json()["items"]
        assert listed == []  # nothing recorded as stored
    finally:
        # when: the store comes back (same address, same data)
        up = s3_script("up", directory=store_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        again = s3_script("env", directory=store_dir)
        assert f"VIGIL_S3_ENDPOINT_URL={store_env['VIGIL_S3_ENDPOINT_URL']}" in again.stdout

    # then: every task completes, each with its output in the store, none failed on the way
    job = await wait_job(client, events, job_id, within=120)
    assert job["state"] == "completed"
    tasks = await _tasks(client, job_id)
    assert {t["state"] for t in tasks} == {"completed"}
    assert [e for e in events.task_states() if e.startswith("failed")] == []
    listed = (await client.get(f"/jobs/{job_id}/outputs", params={"limit": 100})).json()["items"]
    assert [(o["size"], o["downloadable"]) for o in listed] == [(5_000_000, True)] * TASKS
    one = await client.get(f"/tasks/{listed[0]['task_id']}/outputs/out.bin")
    assert one.status_code == 307  # a link to the object in the store, not the bytes
    fetched = vigil(env, "download", job_id, "--to", str(tmp_path / "all"), timeout=180)
    assert fetched.returncode == 0, fetched.stderr
    assert (
        fetched.stdout
        == f"saved {TASKS} outputs ({TASKS * 5_000_000} bytes) to {tmp_path / 'all'}\n"
    )


async def _until_post_processing(
    client: httpx.AsyncClient, job_id: str, within: float = 60.0
) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while True:
            [task] = await _tasks(client, job_id)
            if task["state"] == "post_processing":
                return task
            await asyncio.sleep(0.05)  # no event says that stage-out began


#: Bounds: the command's end (60 s) and the rerun's (180 s).
@pytest.mark.timeout(300)
async def test_a_host_killed_mid_upload_leaves_no_partial_object_and_its_rerun_is_recorded(
    client: httpx.AsyncClient,
    events: Events,
    stack: Stack,
    store_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: a task whose 200 MB output is being put in the store
    body = {
        "command": "head -c 200000000 /dev/urandom > big.bin",
        "outputs": ["big.bin"],
        "policy": {"restartable": True},
    }
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    await _until_post_processing(client, job_id)

    # when: its host dies (worker and supervisor), then comes back
    stack.kill("worker", signal.SIGKILL)
    stack.kill("supervisor", signal.SIGKILL)
    stack.start("supervisor")
    stack.start("worker")

    # then: the task is run again and completes; what is recorded is the rerun's output
    job = await wait_job(client, events, job_id, within=180)
    assert job["state"] == "completed"
    [output] = (await client.get(f"/jobs/{job_id}/outputs")).json()["items"]
    task = (await client.get(f"/tasks/{output['task_id']}")).json()
    made = hashlib.sha256((Path(task["workdir"]) / "big.bin").read_bytes()).hexdigest()
    assert (output["size"], output["sha256"]) == (200_000_000, made)
    # and the store lists no partial object of the job: each is whole
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, store_env[name])
    store = open_store(stack.extra_env["VIGIL_STORE_URL"], store_env["VIGIL_S3_ENDPOINT_URL"])
    listed = await store.list_prefix(f"outputs/{job_id}")
    assert listed, "the rerun's output is in the store"
    assert {info.size for info in listed} == {200_000_000}
