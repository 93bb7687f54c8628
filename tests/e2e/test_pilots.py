"""Pilots on a real Slurm: the scheduler asks for pilots when work waits that no
host can take, a job completes on them, an idle pilot is cancelled, a pilot `scancel`ed
mid-job loses nothing (its tasks run again elsewhere, never twice at once), a pilot `scancel`ed
after its task completed, its node's disk gone with it, leaves every output downloadable from
the object store (the real SeaweedFS of `scripts/s3`), a pilot whose
walltime ends charges nothing to the application, a task not restartable and of unknown length
waits (`host_ends`) rather than go to a pilot that would end under it, and a pilot Slurm
cannot start says why. An operator's pilots are asked for, listed and removed with the
installed `vigil pilots add|ls|rm`, as the README's Slurm block does.

The stack has no host of its own: only the api and the scheduler run, and every host is a
pilot that Slurm starts (`scripts/slurm`, the `slurm_conf` fixture)."""

import asyncio
import hashlib
import itertools
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from shared.batch.slurm import Slurm
from shared.messaging.topology import Topology
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database
from tests.e2e.attempts import cluster_attempts
from tests.e2e.broker_queues import queues_of
from tests.e2e.conftest import Events, vigil, wait_job
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

#: The pilots' settings for the one-node Slurm of the tests, each departure from a default
#: with its reason.
PILOT_ENV = {
    "VIGIL_PILOTS_BACKEND": "slurm",  # pilots are what these tests are about (default: none)
    "VIGIL_PILOTS_MAX": "2",  # as many as the node's two CPUs hold
    "VIGIL_PILOTS_CPUS": "1",  # (the default, said here: two fit on the node)
    "VIGIL_PILOTS_WALLTIME_S": "600",  # a pilot a failed test leaves behind ends within 10 min
    "VIGIL_PILOTS_IDLE_S": "3",  # an idle pilot's end seen in seconds, not minutes
    # a lost task whose process is not known dead is resubmitted after 10 s, not a minute
    "VIGIL_FENCE_TIMEOUT_S": "10",
}


def _stack(root: Path, namespace: str, slurm_conf: str, **env: str) -> Iterator[Stack]:
    with fresh_database("vigil_e2e") as url:
        s = Stack(
            database_url=url,
            amqp_url=AMQP_URL,
            redis_url=REDIS_URL,
            namespace=namespace,
            root=root,
            hosts=["unused"],  # no host of its own: pilots only
            extra_env={
                **E2E_ENV,
                **PILOT_ENV,
                "SLURM_CONF": slurm_conf,
                "VIGIL_PILOTS_DIR": str(root / "pilots"),
                **env,
            },
        )
        s.work_root.mkdir(parents=True, exist_ok=True)
        try:
            s.start("api")
            s.start("scheduler")
            s.wait_healthy()
            yield s
        finally:
            s.stop_all()
            asyncio.run(_cancel_all(slurm_conf, list((root / "pilots").glob("pilot-*.out"))))
            s.remove_work_root()
            for name in s.procs:
                print(f"----- {name} -----\n{s.log(name)}")  # noqa: T201
            for out in sorted((root / "pilots").glob("pilot-*.out")):
                print(f"----- {out.name} -----\n{out.read_text(errors='replace')}")  # noqa: T201


async def _cancel_all(slurm_conf: str, outputs: list[Path]) -> None:
    """Cancel every pilot this stack submitted (their outputs name their batch jobs)."""
    slurm = Slurm(slurm_conf)
    for out in outputs:
        await slurm.cancel(out.stem.removeprefix("pilot-"))


@pytest.fixture
def stack(
    request: pytest.FixtureRequest, tmp_path: Path, e2e_namespace: str, slurm_conf: str
) -> Iterator[Stack]:
    """The pilots' stack; parametrized indirectly with "s3", it keeps outputs in the real
    SeaweedFS of `scripts/s3` (under a prefix of its own) and keeps an idle pilot for five
    minutes, so that the test, not the scheduler, ends it."""
    env: dict[str, str] = {}
    if getattr(request, "param", None) == "s3":
        s3_env: dict[str, str] = request.getfixturevalue("s3_env")
        prefix = f"{s3_env['VIGIL_STORE_URL']}/e2e-{uuid.uuid4().hex[:8]}"
        env = s3_env | {"VIGIL_STORE_URL": prefix, "VIGIL_PILOTS_IDLE_S": "300"}
    yield from _stack(tmp_path, e2e_namespace, slurm_conf, **env)


async def _pilots(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await client.get("/pilots")
    assert response.status_code == 200, response.text
    return list(response.json())


async def _until(check: Any, within: float = 90.0) -> Any:
    """The first true answer of `check()` (awaited), polled every 0.2 s, within `within` s."""
    async with asyncio.timeout(within):
        while True:
            if found := await check():
                return found
            await asyncio.sleep(0.2)


async def _task_rows(stack: Stack, job_id: str) -> list[Any]:
    conn = await asyncpg.connect(stack.database_url)
    try:
        return list(
            await conn.fetch(
                "SELECT index, state, failure_class, app_retries, infra_retries, host"
                " FROM tasks WHERE job_id = $1 ORDER BY index, created_at",
                job_id,
            )
        )
    finally:
        await conn.close()


async def test_pilots_come_on_demand_run_a_job_and_go_when_idle(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given no host at all, when a job of three tasks is submitted (each ends within a
    # minute: a pilot takes it)
    body = {"command": "echo $VIGIL_INPUT", "inputs": list("abc"), "policy": {"walltime": 60}}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    # then pilots are asked for, Slurm runs them, and the job completes on them
    assert (await wait_job(client, events, job_id, within=120))["state"] == "completed"
    hosts = {a["host"] for a in await cluster_attempts(stack, job_id)}
    assert hosts

    # (a pilot names its host once the scheduler has seen it run: it follows Slurm every 2 s)
    async def named() -> list[dict[str, Any]] | None:
        pilots = await _pilots(client)
        return pilots if hosts <= {p["host_id"] for p in pilots} else None

    pilots = await _until(named, within=30)
    assert all(p["requested_by"] == "scheduler" and p["batch_job_id"] for p in pilots)

    # and once idle, each is cancelled
    async def all_ended() -> bool:
        return all(p["state"] == "ended" for p in await _pilots(client))

    await _until(all_ended, within=60)
    # (one still pending once the job is done is withdrawn: no work waits for it)
    ended = {"idle", "cancelled", "completed", "no work waits for it"}
    assert {p["reason"] for p in await _pilots(client)} <= ended


async def test_a_pilot_that_ends_leaves_no_queue_of_its_host_within_a_minute(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a job run on pilots, which end once idle
    body = {"command": "sleep 5", "inputs": ["a"], "policy": {"walltime": 60}}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}", within=120)
    hosts = {a["host"] for a in await cluster_attempts(stack, job_id)}
    topology = Topology(stack.namespace)
    names = {q for h in hosts for q in (topology.host_queue(h), topology.supervisor_queue(h))}
    # (while its pilot runs the task, the broker has the host's work and supervise queues)
    assert hosts and names <= await asyncio.to_thread(queues_of, stack.namespace)
    assert (await wait_job(client, events, job_id, within=120))["state"] == "completed"

    async def all_ended() -> bool:
        return all(p["state"] == "ended" for p in await _pilots(client))

    await _until(all_ended, within=60)

    # then within a minute none of them is left on the broker (as `rabbitmqctl` lists them)
    async def none_left() -> bool:
        return not names & await asyncio.to_thread(queues_of, stack.namespace)

    await _until(none_left, within=60)


async def test_a_pilot_cancelled_mid_job_loses_nothing_and_runs_nothing_twice_at_once(
    stack: Stack, client: httpx.AsyncClient, events: Events, slurm_conf: str
) -> None:
    # given a job of two restartable 5-second tasks running on pilots
    body = {"command": "sleep 5", "inputs": ["a", "b"], "policy": {"restartable": True}}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    await events.wait_key(f"task.on_cpu.{job_id}", within=120)

    # when the pilot running one of them is cancelled in Slurm
    async def running_pilot() -> dict[str, Any] | None:
        rows = await _task_rows(stack, job_id)
        busy = {r["host"] for r in rows if r["state"] == "on_cpu"}
        return next((p for p in await _pilots(client) if p["host_id"] in busy), None)

    pilot = await _until(running_pilot)
    await Slurm(slurm_conf).cancel(pilot["batch_job_id"])

    # then the job completes anyway: the lost task ran again, charged to infra, and no
    # input's commands ever overlapped
    assert (await wait_job(client, events, job_id, within=180))["state"] == "completed"
    rows = await _task_rows(stack, job_id)
    lost = [r for r in rows if r["failure_class"] == "lost"]
    assert lost, rows
    assert all(r["app_retries"] == 0 for r in rows)
    conn = await asyncpg.connect(stack.database_url)
    try:
        attempts = await conn.fetch(
            "SELECT t.index, a.started_at, coalesce(a.ended_at, now()) AS ended_at"
            " FROM attempts a JOIN tasks t ON t.id = a.task_id"
            " WHERE t.job_id = $1 AND a.stage = 'cluster' ORDER BY t.index, a.started_at",
            job_id,
        )
    finally:
        await conn.close()
    assert len(attempts) >= 3
    for before, after in itertools.pairwise(attempts):
        if before["index"] == after["index"]:
            assert before["ended_at"] <= after["started_at"], (before, after)


#: Two outputs of a few MB, made on the pilot's node.
_MADE_ON_THE_NODE = "head -c 3000000 /dev/urandom > a.bin; head -c 2500000 /dev/urandom > b.bin"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stack", ["s3"], indirect=True)
async def test_a_pilot_scancelled_after_its_tasks_completed_leaves_every_output_downloadable(
    stack: Stack,
    client: httpx.AsyncClient,
    events: Events,
    env: dict[str, str],
    slurm_conf: str,
    tmp_path: Path,
) -> None:
    # given a job whose two outputs of a few MB were made on a pilot, and completed
    body = {
        "command": _MADE_ON_THE_NODE,
        "outputs": ["a.bin", "b.bin"],
        "inputs": ["x"],
        "policy": {"walltime": 60},  # a task of unknown length never goes to a pilot
    }
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert (await wait_job(client, events, job_id, within=120))["state"] == "completed"
    [row] = await _task_rows(stack, job_id)
    work_dir = stack.work_root / job_id
    [task_dir] = list(work_dir.iterdir())
    made = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in task_dir.glob("*.bin")}
    assert sorted(made) == ["a.bin", "b.bin"]

    async def its_pilot() -> dict[str, Any] | None:
        return next((p for p in await _pilots(client) if p["host_id"] == row["host"]), None)

    pilot = await _until(its_pilot, within=30)
    assert pilot["state"] == "running", pilot

    # when an admin scancels the pilot's allocation, and the node's disk goes with it (here,
    # the node is this machine: the task's work dir under the pilots' work root is removed)
    scancel = await asyncio.create_subprocess_exec(
        "scancel",
        pilot["batch_job_id"],
        env={**os.environ, "SLURM_CONF": slurm_conf},
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(scancel.communicate(), 30)
    assert scancel.returncode == 0, err

    async def ended() -> bool:
        return any(p["id"] == pilot["id"] and p["state"] == "ended" for p in await _pilots(client))

    await _until(ended, within=60)
    shutil.rmtree(work_dir)

    # then the installed `vigil download` fetches every output, each with its sha256
    to = tmp_path / "harvest"
    downloaded = await asyncio.to_thread(vigil, env, "download", job_id, "--to", str(to))
    assert downloaded.returncode == 0, downloaded.stderr
    got = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (to / task_dir.name).iterdir()
    }
    assert got == made
    listed = (await client.get(f"/jobs/{job_id}/outputs")).json()["items"]
    assert {o["name"]: o["sha256"] for o in listed} == made


@pytest.fixture
def short_stack(tmp_path: Path, e2e_namespace: str, slurm_conf: str) -> Iterator[Stack]:
    """Pilots of one minute, stopping themselves 30 s before their end."""
    yield from _stack(
        tmp_path,
        e2e_namespace,
        slurm_conf,
        VIGIL_PILOTS_WALLTIME_S="60",
        VIGIL_PILOTS_MAX="1",
        VIGIL_PILOT_DRAIN_S="40",
        VIGIL_PILOT_STOP_S="30",
    )


@pytest.fixture
async def short_client(short_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {short_stack.token}"}
    async with httpx.AsyncClient(base_url=short_stack.base_url, headers=headers, timeout=10) as c:
        yield c


async def test_a_pilot_reaching_its_walltime_charges_nothing_to_the_application(
    short_stack: Stack, short_client: httpx.AsyncClient
) -> None:
    # given a restartable task longer than any pilot lives
    body = {"command": "sleep 300", "inputs": ["long"], "policy": {"restartable": True}}
    response = await short_client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    # when its pilot reaches the end of its allocation, then the task was lost to infra and
    # resubmitted, its application's budget untouched
    async def resubmitted() -> list[Any]:
        rows = await _task_rows(short_stack, job_id)
        return rows if len(rows) >= 2 else []

    rows = await _until(resubmitted, within=120)
    first = rows[0]
    assert first["failure_class"] == "lost"
    assert all(r["app_retries"] == 0 for r in rows)
    assert rows[-1]["infra_retries"] >= 1


#: A row of `vigil pilots` (to a pipe: no cell cut): the state's reason is in brackets.
_PILOT_ROW = re.compile(
    r"(?P<id>\S+)\s+(?P<state>[a-z]+)(?: \((?P<reason>.*)\))?\s+(?P<batch>\S+)\s+"
    r"(?P<host>\S+)\s+(?P<cpus>\S+)\s+(?P<walltime>\d+ s)\s+(?P<ends>\S+)"
)


def _pilot_rows(listed: str) -> dict[str, dict[str, str | None]]:
    """`vigil pilots`' table by pilot id: each row's cells by column."""
    header, *rows = listed.splitlines()
    assert header.split() == ["PILOT", "STATE", "BATCH", "JOB", "HOST", "CPUS", "WALLTIME", "ENDS"]
    found = {}
    for row in rows:
        cells = _PILOT_ROW.fullmatch(row.strip())
        assert cells is not None, f"not a pilot's row: {row!r}"
        found[cells["id"]] = cells.groupdict()
    return found


async def test_a_task_not_restartable_and_of_unknown_length_never_goes_to_a_pilot(
    stack: Stack, client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    # given a pilot running, asked for as the README does (`vigil pilots add`), and nothing else
    added = await asyncio.to_thread(vigil, env, "pilots", "add", "--walltime", "600")
    assert added.returncode == 0, added.stderr
    [pilot_id] = _pilot_rows(added.stdout)

    async def running() -> dict[str, Any] | None:
        """The pilot once its host's worker takes work (the planner sees it)."""
        found = next(p for p in await _pilots(client) if p["id"] == pilot_id)
        if found["state"] != "running" or not found["host_id"]:
            return None
        hosts = (await client.get("/hosts")).json()
        taking = any(
            h["id"] == found["host_id"] and h["worker"] and h["capacity"]["cpus"] > 0 for h in hosts
        )
        return found if taking else None

    up = await _until(running)
    # (`vigil pilots` shows it on its host, running, or draining once idle for
    # VIGIL_PILOTS_IDLE_S; `vigil hosts` lists that host)
    listed = await asyncio.to_thread(vigil, env, "pilots")
    row = _pilot_rows(listed.stdout)[pilot_id]
    assert row["state"] in ("running", "draining"), listed.stdout
    assert (row["batch"], row["host"]) == (up["batch_job_id"], up["host_id"]), listed.stdout
    assert up["host_id"] == f"pilot-{up['batch_job_id']}"
    hosts = await asyncio.to_thread(vigil, env, "hosts")
    assert up["host_id"] in hosts.stdout.split(), hosts.stdout

    # when Alice submits `sleep 600`, without walltime, not restartable
    response = await client.post("/jobs", json={"command": "sleep 600", "inputs": ["a"]})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    # then it waits, saying why, instead of being lost with the pilot; no pilot is asked for
    async def waiting() -> dict[str, Any] | None:
        job = (await client.get(f"/jobs/{job_id}")).json()
        wait = job.get("waiting") or {}
        return wait if wait.get("reason") == "host_ends" else None

    wait = await _until(waiting, within=30)
    assert "not restartable, no walltime" in wait["message"]
    assert up["host_id"] in wait["message"]
    assert [r["host"] for r in await _task_rows(stack, job_id)] == [None]
    assert [p["id"] for p in await _pilots(client)] == [pilot_id]


async def test_a_pilot_slurm_cannot_start_says_why_and_an_operator_removes_it(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    # given a pilot of more CPUs than the node has, asked for with `vigil pilots add`
    cpus = (os.cpu_count() or 2) * 16
    added = await asyncio.to_thread(
        vigil, env, "pilots", "add", "--cpus", str(cpus), "--walltime", "60"
    )
    assert added.returncode == 0, added.stderr
    [(pilot_id, row)] = _pilot_rows(added.stdout).items()
    assert (row["state"], row["cpus"], row["walltime"]) == ("requested", str(cpus), "60 s")

    # then `vigil pilots` says why Slurm does not start it
    async def explained() -> dict[str, str | None] | None:
        listed = await asyncio.to_thread(vigil, env, "pilots", "ls")
        found = _pilot_rows(listed.stdout)[pilot_id]
        return found if found["state"] in ("pending", "ended") and found["reason"] else None

    seen = await _until(explained, within=30)
    assert seen["reason"], seen

    # and `vigil pilots rm` stops it; once ended, `--live` leaves it out
    removed = await asyncio.to_thread(vigil, env, "pilots", "rm", pilot_id)
    assert removed.returncode == 0, removed.stderr
    assert list(_pilot_rows(removed.stdout)) == [pilot_id]
    missing = await asyncio.to_thread(vigil, env, "pilots", "rm")
    assert missing.returncode == 2 and missing.stderr == "vigil: vigil pilots rm needs a PILOT\n"

    async def gone() -> bool:
        live = await asyncio.to_thread(vigil, env, "pilots", "--live")
        return pilot_id not in _pilot_rows(live.stdout)

    await _until(gone, within=30)
    [ended] = [p for p in await _pilots(client) if p["id"] == pilot_id]
    assert ended["state"] == "ended"
