"""What a job sees from inside, under the configuration a user gets from the README:
the services run as root, so every job runs confined, as its owner's own uid, with the default
limits; the stack's root is a private dir (pytest's, as a clone in /root is), and the work root
is the one `scripts/up` would pick (`shared/host/work_root.py`).

Each feature a job reaches by an absolute path broke there: its status file
(`$VIGIL_STATUS_FILE`, with `$VIGIL_RESUME` after it) and the outputs of its upstream task."""

import asyncio
import base64
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from shared.store import users_repo
from tests.e2e.conftest import Events, vigil, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

#: The uid of a confined job is this + its owner's number (the worker's default).
UID_BASE = 2_000_000


@pytest.fixture
async def user(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """A plain user of the stack (not an operator): a client with their token."""
    token = uuid.uuid4().hex
    conn = await asyncpg.connect(stack.database_url)
    try:
        await users_repo.ensure_user(conn, f"user-{token[:8]}", "user", token)
    finally:
        await conn.close()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as c:
        yield c


async def _submit(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    answer = await client.post("/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


async def _run(client: httpx.AsyncClient, events: Events, body: dict[str, Any]) -> dict[str, Any]:
    """Submit `body`, wait for the job's end; the job then, with its tasks and log lines."""
    job_id = await _submit(client, body)
    job = await wait_job(client, events, job_id)
    job["tasks"] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    job["lines"] = await _lines(client, job_id)
    return job


async def _lines(client: httpx.AsyncClient, job_id: str) -> list[str]:
    items = (await client.get(f"/jobs/{job_id}/logs")).json()["items"]
    return [item["line"] for item in items]


async def test_a_job_runs_as_its_owners_uid_and_reaches_its_own_files_by_their_paths(
    user: httpx.AsyncClient, events: Events
) -> None:
    probe = (
        'test "$(id -u)" -ge ' + str(UID_BASE) + ' && echo "confined"\n'
        'echo data > "$VIGIL_WORKDIR/own.txt" && cat "$VIGIL_WORKDIR/own.txt"\n'
        'ls -d "$(dirname "$VIGIL_STATUS_FILE")" >/dev/null && echo "status dir reachable"\n'
    )

    job = await _run(user, events, {"command": probe})

    assert job["state"] == "completed", job
    assert job["lines"] == ["confined", "data", "status dir reachable"]


async def test_a_recoverable_status_runs_again_in_place_with_its_resume(
    user: httpx.AsyncClient, events: Events
) -> None:
    command = (
        'if [ -n "$VIGIL_RESUME" ]; then echo "resumed from $VIGIL_RESUME"; exit 0; fi\n'
        'echo \'{"status": "recoverable", "resume": {"step": 3}, "message": "checkpointed"}\''
        ' > "$VIGIL_STATUS_FILE"\n'
        "exit 5\n"
    )

    job = await _run(user, events, {"command": command, "policy": {"max_app_retries": 2}})

    assert job["state"] == "completed", job
    [task] = job["tasks"]
    assert (task["run_number"], task["app_retries"]) == (1, 1)  # recovered in place
    assert job["lines"] == ['resumed from {"step": 3}']


async def test_a_fatal_status_is_never_retried_and_keeps_its_message(
    user: httpx.AsyncClient, events: Events
) -> None:
    command = (
        'echo \'{"status": "fatal", "message": "input is corrupt"}\' > "$VIGIL_STATUS_FILE"\n'
        "exit 5\n"
    )

    job = await _run(user, events, {"command": command, "policy": {"max_app_retries": 3}})

    assert job["state"] == "failed", job
    [task] = job["tasks"]
    assert (task["state"], task["run_number"], task["app_retries"]) == ("failed_on_cluster", 1, 0)
    assert task["error_brief"] == "command exited with code 5: input is corrupt"


@pytest.mark.parametrize(
    ("make", "brief"),
    [
        ('mkdir "$VIGIL_STATUS_FILE"', "is not a regular file (a directory)"),
        ('mkfifo "$VIGIL_STATUS_FILE"', "is not a regular file (a FIFO)"),
        # the job's own mode does not keep its diagnosis from the worker
        (
            'echo \'{"status": "fatal", "message": "hidden"}\' > "$VIGIL_STATUS_FILE"'
            ' && chmod 000 "$VIGIL_STATUS_FILE"',
            "hidden",
        ),
    ],
    ids=["directory", "fifo", "unreadable"],
)
async def test_a_status_file_the_job_made_odd_ends_its_task_explained(
    user: httpx.AsyncClient, events: Events, make: str, brief: str
) -> None:
    job = await _run(user, events, {"command": f"{make}\nexit 0\n"})

    assert job["state"] == "failed", job
    [task] = job["tasks"]
    assert task["state"] == "failed_on_cluster"
    assert brief in task["error_brief"], task


async def test_a_chained_task_reads_its_upstream_output_and_cannot_change_it(
    user: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given: A writes a.txt per input; its "slow" task waits for the test's gate
    gate = shared_dir / "open"
    a_id = await _submit(
        user,
        {
            "command": (
                'echo "from $VIGIL_INPUT" > a.txt\n'
                f'if [ "$VIGIL_INPUT" = slow ]; then until [ -e {gate} ]; do sleep 0.05; done; fi\n'
            ),
            "inputs": ["fast", "slow"],
            "outputs": ["a.txt"],
        },
    )
    # when: B is chained from A while A still runs
    b_id = await _submit(
        user,
        {
            "command": (
                "cat a.txt && cp a.txt b.txt\n"
                "if { echo forged >> a.txt; } 2>/dev/null; then echo 'changed A'; else echo 'A is"
                " read-only'; fi\n"
                'echo "$VIGIL_INPUT" | grep -q "\\"a.txt\\": \\"$PWD/a.txt\\"" && echo named\n'
            ),
            "inputs_from": a_id,
            "outputs": ["b.txt"],
        },
    )

    # then: B's task of "fast" completes while A's "slow" task still runs (streamed)
    await events.wait_for(lambda k, _b: k.startswith("task.completed.") and k.endswith(b_id))
    a_now = (await user.get(f"/jobs/{a_id}")).json()
    assert a_now["state"] == "active", a_now
    gate.touch()
    a = await wait_job(user, events, a_id)
    b = await wait_job(user, events, b_id)
    assert (a["state"], b["state"]) == ("completed", "completed"), (a, b)
    lines = await _lines(user, b_id)
    assert sorted(lines) == sorted(
        ["from fast", "A is read-only", "named", "from slow", "A is read-only", "named"]
    )
    # B's own outputs are recorded and A's are as A wrote them
    b_outputs = (await user.get(f"/jobs/{b_id}/outputs")).json()["items"]
    got = [(await user.get(f"/tasks/{o['task_id']}/outputs/b.txt")).content for o in b_outputs]
    assert sorted(got) == [b"from fast\n", b"from slow\n"]
    for output in (await user.get(f"/jobs/{a_id}/outputs")).json()["items"]:
        written = await asyncio.to_thread(Path(output["path"]).read_text)
        assert written in ("from fast\n", "from slow\n")


async def test_a_chained_input_whose_file_is_gone_comes_from_the_store(
    user: httpx.AsyncClient, events: Events
) -> None:
    # given: A's work dir is gone from this host (tidied by hand, or A ran on a host now gone)
    a = await _run(user, events, {"command": "echo kept > a.txt", "outputs": ["a.txt"]})
    assert a["state"] == "completed", a
    await asyncio.to_thread(shutil.rmtree, a["tasks"][0]["workdir"])

    # when
    b = await _run(
        user, events, {"command": "cat a.txt", "inputs": [{"upstream_task": a["tasks"][0]["id"]}]}
    )

    # then: the output came from the object store, where stage-out put it
    assert b["state"] == "completed", b
    assert b["lines"] == ["kept"]


async def test_a_chained_input_of_a_purged_job_fails_its_task_saying_so(
    user: httpx.AsyncClient, events: Events
) -> None:
    a = await _run(user, events, {"command": "echo kept > a.txt", "outputs": ["a.txt"]})
    [upstream] = a["tasks"]
    purged = await user.post(f"/jobs/{a['id']}/actions", json={"action": "purge"})
    assert purged.status_code == 202, purged.text
    await events.wait_key(f"job.purged.{a['id']}")
    async with asyncio.timeout(20):
        while await asyncio.to_thread(Path(upstream["workdir"]).exists):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    b = await _run(
        user, events, {"command": "cat a.txt", "inputs": [{"upstream_task": upstream["id"]}]}
    )

    assert b["state"] == "failed", b
    [task] = b["tasks"]
    assert f"output 'a.txt' of task {upstream['id']}" in task["error_brief"], task
    assert f"job {a['id']} was purged at" in task["error_brief"], task


async def test_a_prerequisite_on_a_task_gives_its_outputs_to_read(
    user: httpx.AsyncClient, events: Events
) -> None:
    a = await _run(user, events, {"command": "echo 42 > answer.txt", "outputs": ["answer.txt"]})
    upstream = a["tasks"][0]["id"]

    b = await _run(
        user,
        events,
        {
            "command": 'echo "answer: $(cat answer.txt)"',
            "inputs": [{"upstream_task": upstream}],
            "prerequisites": {"setup": {upstream: "completed"}},
        },
    )

    assert b["state"] == "completed", b
    assert b["lines"] == ["answer: 42"]


async def test_outputs_are_recorded_and_downloadable_from_a_confined_job(
    user: httpx.AsyncClient, events: Events
) -> None:
    job = await _run(
        user,
        events,
        {"command": 'echo "result of $VIGIL_INPUT" > r.txt', "inputs": ["x"], "outputs": ["r.txt"]},
    )

    assert job["state"] == "completed", job
    [listed] = (await user.get(f"/jobs/{job['id']}/outputs")).json()["items"]
    got = await user.get(f"/tasks/{listed['task_id']}/outputs/r.txt")
    assert got.content == b"result of x\n"
    assert json.loads(json.dumps(listed))["downloadable"] is True


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


RENDER = '#!/bin/bash\necho "rendering $1 with $(cat conf/scene.txt)"\n'


async def test_a_jobs_own_files_are_in_every_task_read_only(
    user: httpx.AsyncClient, events: Events
) -> None:
    # given: a job that brings its script and its config (`./render.sh` was exit 127)
    files = {
        "render.sh": {"content": _b64(RENDER), "executable": True},
        "conf/scene.txt": {"content": _b64("a teapot\n")},
    }
    command = (
        './render.sh "$VIGIL_INPUT"\n'
        "if { echo forged >> conf/scene.txt; } 2>/dev/null; then echo changed; else echo"
        " read-only; fi\n"
    )

    # when
    job = await _run(user, events, {"command": command, "inputs": ["a", "b"], "files": files})

    # then
    assert job["state"] == "completed", job
    assert sorted(job["lines"]) == [
        "read-only",
        "read-only",
        "rendering a with a teapot",
        "rendering b with a teapot",
    ]
    assert [(f["path"], f["size"], f["executable"]) for f in job["files"]] == [
        ("conf/scene.txt", 9, False),
        ("render.sh", len(RENDER), True),
    ]


async def test_a_bad_file_is_refused_whole_and_no_job_is_made(user: httpx.AsyncClient) -> None:
    before = (await user.get("/jobs")).json()["items"]
    bad = [
        ({"../x": {"content": _b64("x")}}, "not a relative path"),
        ({".vigil/status.run1.json": {"content": _b64("x")}}, "is in .vigil"),
        ({"a": {"content": "not base64!"}}, "is not base64"),
        ({"out.txt": {"content": _b64("x")}}, "also an output"),
    ]

    answers = [
        await user.post("/jobs", json={"command": "true", "outputs": ["out.txt"], "files": f})
        for f, _ in bad
    ]

    for answer, (_, why) in zip(answers, bad, strict=True):
        assert answer.status_code == 422, answer.text
        assert why in answer.text
    assert (await user.get("/jobs")).json()["items"] == before


def test_the_cli_sends_the_files_its_job_file_names(
    stack: Stack, env: dict[str, str], tmp_path: Path
) -> None:
    # given: a campaign directory with its script and config, and a job file naming them
    (tmp_path / "render.sh").write_text(RENDER)
    (tmp_path / "render.sh").chmod(0o755)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "scene.txt").write_text("a lamp\n")
    (tmp_path / "extra.txt").write_text("more\n")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        'command: ./render.sh "$VIGIL_INPUT" && cat extra.txt\n'
        "inputs: [x]\nfiles: [render.sh, conf]\n"
    )

    # when: submitted from elsewhere, with one more file on the command line
    done = vigil(env, "submit", str(job_file), "--file", str(tmp_path / "extra.txt"), "--wait")
    job_id = done.stdout.split()[0] if done.stdout else ""
    logs = vigil(env, "logs", job_id)

    # then
    assert done.returncode == 0, done.stderr
    assert logs.returncode == 0, logs.stderr
    assert "rendering x with a lamp" in logs.stdout and "more" in logs.stdout, logs.stdout
