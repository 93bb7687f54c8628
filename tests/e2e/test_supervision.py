"""Each failure class end to end, with real processes and real signals (design §5).

Error logs, hangs and walltime are judged by the supervisor; signals, lost workers and silent
hosts lead to resubmission by policy, never to two executions of one task at once.
"""

import asyncio
import itertools
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest

from tests.e2e.conftest import Events, wait_job
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

FAST_RETRY = {"restartable": True, "backoff": {"initial_s": 0.1, "max_s": 0.2}}


async def _submit(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _on_cpu(client: httpx.AsyncClient, events: Events, job_id: str) -> dict[str, Any]:
    await events.wait_key(f"task.on_cpu.{job_id}")
    [task] = [t for t in (await client.get(f"/jobs/{job_id}/tasks")).json() if t["pid"]]
    return dict(task)


async def _task(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    return dict((await client.get(f"/tasks/{task_id}")).json())


async def _rows(stack: Stack, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(stack.database_url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _gone(pid: int, within: float = 5.0) -> bool:
    """Whether `pid` is dead within `within` s (a zombie not yet reaped by its parent is)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.05)
    return False


def _find(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


# -- judged by the supervisor ------------------------------------------------------------------


async def test_when_a_task_logs_an_error__it_fails_as_error_log_and_the_error_is_kept(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a command that logs an error, then would run for a minute
    command = 'echo "starting"; sleep 0.3; echo "ERROR: disk on fire" >&2; sleep 60'
    job_id = await _submit(client, {"command": command})

    # when the supervisor sees the record
    announced = await events.wait_key(f"job.failed.{job_id}", within=15)

    # then the task failed as error_log, its tree was killed, the job failed, the error is kept
    task = await _task(client, announced["task_id"])
    assert (task["state"], task["failure_class"]) == ("failed_on_cluster", "error_log")
    assert "ERROR: disk on fire" in task["error_brief"]
    assert await _gone(task["pid"])
    assert (await wait_job(client, events, job_id))["state"] == "failed"
    [error] = (await client.get(f"/jobs/{job_id}/errors")).json()
    assert (error["task_id"], error["brief"]) == (task["id"], "ERROR: disk on fire")
    assert "starting" in error["detail"]


async def test_when_the_error_severity_is_not_in_fail_on_log__the_task_completes(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    command = 'echo "ERROR: only a warning to us"; echo "done"'
    job_id = await _submit(client, {"command": command, "policy": {"fail_on_log": ["fatal"]}})
    assert (await wait_job(client, events, job_id))["state"] == "completed"


async def test_when_a_task_shows_no_sign_of_life__it_is_hung_and_killed_with_term_first(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a silent command that notes the SIGTERM it gets
    command = "trap 'echo term > got-term; exit 0' TERM; echo hello; sleep 60 & wait"
    job_id = await _submit(client, {"command": command, "policy": {"hang_timeout": 1}})

    # when it stays silent past hang_timeout
    hung = await events.wait_key(f"job.hung.{job_id}", within=15)

    # then it is hung, its tree got TERM then was gone, and the job failed
    task = await _task(client, hung["task_id"])
    assert (task["state"], task["failure_class"]) == ("failed_on_cluster", "hung")
    assert "no sign of life" in task["error_brief"]
    assert await _gone(task["pid"])
    assert await asyncio.to_thread(_find, stack.work_root, "got-term")
    assert (await wait_job(client, events, job_id))["state"] == "failed"


async def test_when_a_task_runs_past_its_walltime__it_fails_as_walltime_even_while_talking(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    command = "while true; do echo tick; sleep 0.1; done"
    policy = {"walltime": 1.5, "hang_timeout": 1}
    job_id = await _submit(client, {"command": command, "policy": policy})
    job = await wait_job(client, events, job_id, within=20)
    [task] = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert (job["state"], task["failure_class"]) == ("failed", "walltime")
    assert await _gone(task["pid"])


async def test_when_a_task_leaves_its_process_group__its_whole_tree_is_still_killed(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a command whose child escaped into a session of its own (found on the host by its
    # name: the pids a job sees are its room's own)
    escaped = f"escaped-{uuid.uuid4().hex[:12]}"
    command = f"setsid bash -c 'exec -a {escaped} sleep 300' & echo started; sleep 60"
    job_id = await _submit(client, {"command": command, "policy": {"hang_timeout": 1}})
    pid = await _host_pid(escaped)
    await events.wait_key(f"job.hung.{job_id}", within=15)

    # then the escaped child is killed too (cgroup, or the stray sweep)
    assert await _gone(pid, within=10)


async def _host_pid(name: str, within: float = 15.0) -> int:
    """The host's pid of the process whose first argument is `name`, once it runs."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for process in await asyncio.to_thread(list, psutil.process_iter(["cmdline"])):
            if (process.info["cmdline"] or [None])[0] == name:
                return int(process.pid)
        await asyncio.sleep(0.05)  # no event says a job's process was made
    raise TimeoutError(f"no process {name} ran within {within} s")


# -- resubmission by policy ----------------------------------------------------------------------


async def test_when_a_restartable_task_is_killed_by_a_signal__a_clone_runs_and_completes(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given a restartable task whose first execution dies of SIGKILL from nobody in Vigil
    marker = shared_dir / f"first-{uuid.uuid4().hex}"
    command = (
        f'if mkdir {marker} 2>/dev/null; then kill -9 $$; fi; echo "second run, try $VIGIL_TRY"'
    )

    job_id = await _submit(client, {"command": command, "policy": FAST_RETRY})

    # when the triage resubmits it
    decision = await events.wait_key(f"task.resubmitted.{job_id}")
    job = await wait_job(client, events, job_id)

    # then the clone completed the job, with the lineage and the decision on record
    assert job["state"] == "completed"
    original = await _task(client, decision["task_id"])
    assert (original["state"], original["failure_class"]) == ("failed_on_cluster", "signal")
    clone = await _task(client, original["superseded_by"])
    assert (clone["state"], clone["resubmitted_from"]) == ("completed", original["id"])
    [row] = await _rows(
        stack,
        "SELECT decision, decision_reason, detected_after_s FROM attempts WHERE task_id = $1"
        " AND decision IS NOT NULL",
        original["id"],
    )
    assert row["decision"] == "resubmitted"
    assert "signal: resubmitted (1/3)" in row["decision_reason"]
    assert row["detected_after_s"] is not None and row["detected_after_s"] < 5
    # and the clone's command knew it was the input's second try
    logs = (await client.get(f"/jobs/{job_id}/logs", params={"task": clone["id"]})).json()
    assert [line["line"] for line in logs["items"]] == ["second run, try 2"]


async def test_when_a_task_is_not_restartable__a_signal_fails_it_without_a_clone(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    job_id = await _submit(client, {"command": "kill -9 $$"})
    decision = await events.wait_key(f"task.abandoned.{job_id}")
    assert "not restartable" in decision["reason"]
    job = await wait_job(client, events, job_id)
    assert (job["state"], job["counts"]) == ("failed", {"failed_on_cluster": 1})


async def test_when_the_infra_budget_is_spent__the_last_clone_stays_failed(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    policy = {**FAST_RETRY, "max_infra_retries": 2}
    job_id = await _submit(client, {"command": "kill -9 $$", "policy": policy})
    job = await wait_job(client, events, job_id, within=30)
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert job["state"] == "failed"
    assert [t["failure_class"] for t in tasks] == ["signal"] * 3
    assert [t["superseded_by"] is None for t in tasks] == [False, False, True]


async def test_with_fail_fast__the_first_failure_fails_the_job_and_revokes_the_rest(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given three tasks, one failing at once and two that would run for a minute
    command = '[ "$VIGIL_INPUT" = b ] && exit 3; sleep 60'
    body = {"command": command, "inputs": ["a", "b", "c"], "policy": {"fail_fast": True}}
    job_id = await _submit(client, body)

    # when the failure is triaged
    job = await wait_job(client, events, job_id, within=20)

    # then the job failed and its other tasks were cancelled, their processes killed
    assert job["state"] == "failed"
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    assert sorted(t["state"] for t in tasks) == ["failed_on_cluster", "terminated", "terminated"]
    for task in tasks:
        if task["state"] == "terminated":
            assert "fail_fast" in task["error_brief"]
            if task["pid"]:
                assert await _gone(task["pid"])


# -- lost workers and hosts: never two executions at once -----------------------------------------


def _sleeps_once(shared_dir: Path) -> str:
    """A command that sleeps a minute on its first run only, then ends at once."""
    marker = shared_dir / f"first-{uuid.uuid4().hex}"
    return f"if mkdir {marker} 2>/dev/null; then sleep 60; fi; echo done"


async def _no_overlap(stack: Stack, job_id: str) -> None:
    """No two cluster attempts of one input overlap: each ended (its process reaped) first."""
    rows = await _rows(
        stack,
        "SELECT t.input, a.started_at, coalesce(a.reaped_at, a.ended_at) AS gone"
        " FROM attempts a JOIN tasks t ON t.id = a.task_id"
        " WHERE t.job_id = $1 AND a.stage = 'cluster' ORDER BY a.started_at",
        job_id,
    )
    by_input: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        by_input.setdefault(str(row["input"]), []).append(row)
    for runs in by_input.values():
        for before, after in itertools.pairwise(runs):
            assert before["gone"] is not None and before["gone"] <= after["started_at"]


async def test_when_the_worker_is_killed__its_restartable_tasks_are_resubmitted_once(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given a restartable task running (it sleeps only on its first run)
    job_id = await _submit(client, {"command": _sleeps_once(shared_dir), "policy": FAST_RETRY})
    task = await _on_cpu(client, events, job_id)

    # when the worker dies, and comes back
    stack.kill("worker", signal.SIGKILL)
    await events.wait_key(f"task.resubmitted.{job_id}", within=10)
    assert await _gone(task["pid"])
    stack.start("worker")

    # then the clone completes the job, after the first process was gone
    assert (await wait_job(client, events, job_id, within=30))["state"] == "completed"
    lost = await _task(client, task["id"])
    assert (lost["failure_class"], lost["superseded_by"] is not None) == ("lost", True)
    await _no_overlap(stack, job_id)


async def test_when_the_worker_freezes__its_tasks_are_lost_and_its_late_report_is_recorded(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given a restartable task whose first run ends by itself after 4 s
    job_id = await _submit(client, {"command": _sleeps_once(shared_dir), "policy": FAST_RETRY})
    task = await _on_cpu(client, events, job_id)

    # when the worker is stopped past its heartbeat deadline, then resumed
    worker = stack.procs["worker"]
    worker.send_signal(signal.SIGSTOP)
    try:
        crashed = await events.wait_key(f"job.crashed.{job_id}", within=15)
        assert crashed["task_id"] == task["id"]
        assert await _gone(task["pid"])  # the supervisor killed the frozen worker's process
    finally:
        worker.send_signal(signal.SIGCONT)

    # then the clone completes, and the woken worker's report was rejected and kept
    assert (await wait_job(client, events, job_id, within=30))["state"] == "completed"
    lost = await _task(client, task["id"])
    assert (lost["state"], lost["failure_class"]) == ("failed_on_cluster", "lost")
    assert "stopped heartbeating" in lost["error_brief"]
    for _ in range(50):
        late = await _rows(
            stack,
            "SELECT late_report FROM attempts WHERE task_id = $1 AND late_report IS NOT NULL",
            task["id"],
        )
        if late:
            break
        await asyncio.sleep(0.1)
    assert late and json.loads(late[0]["late_report"])["rejected_because"]
    await _no_overlap(stack, job_id)


async def test_when_the_supervisor_restarts__it_reattaches_to_running_processes(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a running task
    job_id = await _submit(client, {"command": "sleep 60"})
    task = await _on_cpu(client, events, job_id)

    # when the supervisor dies and a new one starts, then the process is killed from outside
    stack.kill("supervisor", signal.SIGKILL)
    stack.start("supervisor")
    await asyncio.to_thread(_wait_log, stack, "supervisor", f"watching task {task['id']}")
    os.kill(task["pid"], signal.SIGKILL)

    # then the new supervisor saw it, and nothing else was disturbed
    await events.wait_key(f"job.crashed.{job_id}", within=10)
    after = await _task(client, task["id"])
    assert (after["state"], after["failure_class"]) == ("failed_on_cluster", "signal")


async def test_when_the_whole_host_goes_silent__its_task_is_resubmitted_only_after_the_kill(
    stack: Stack, client: httpx.AsyncClient, events: Events, shared_dir: Path
) -> None:
    # given a restartable task running on a host
    job_id = await _submit(client, {"command": _sleeps_once(shared_dir), "policy": FAST_RETRY})
    task = await _on_cpu(client, events, job_id)

    # when worker and supervisor both die: the scheduler declares the task lost (the supervisor
    # first: one that outlives its worker, even by a millisecond, kills the worker's processes)
    stack.kill("supervisor", signal.SIGKILL)
    stack.kill("worker", signal.SIGKILL)
    await events.wait_key(f"job.crashed.{job_id}", within=15)

    # then no clone is made while the orphan process may still run...
    assert psutil.pid_exists(task["pid"])
    assert f"task.resubmitted.{job_id}" not in events.routing_keys()
    # ...until the host's supervisor is back and has killed it
    stack.start("supervisor")
    stack.start("worker")
    await events.wait_key(f"task.resubmitted.{job_id}", within=15)
    assert await _gone(task["pid"])
    assert (await wait_job(client, events, job_id, within=30))["state"] == "completed"
    await _no_overlap(stack, job_id)


def _wait_log(stack: Stack, service: str, text: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if text in stack.log(service):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{service} never logged {text!r}")


async def test_when_a_job_is_suspended__its_processes_stop_and_are_not_judged_hung(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    # given a talkative task with a short hang_timeout
    command = "for i in $(seq 30); do echo $i; sleep 0.1; done"
    job_id = await _submit(client, {"command": command, "policy": {"hang_timeout": 1}})
    task = await _on_cpu(client, events, job_id)

    # when its job is suspended: the process is stopped, and stays silent past hang_timeout
    await client.post(f"/jobs/{job_id}/actions", json={"action": "suspend"})
    assert await _status(task["pid"], psutil.STATUS_STOPPED)
    await asyncio.sleep(2.5)  # an observation window: nothing may happen in it
    assert f"job.hung.{job_id}" not in events.routing_keys()

    # then, resumed, it continues and completes
    await client.post(f"/jobs/{job_id}/actions", json={"action": "resume"})
    assert (await wait_job(client, events, job_id))["state"] == "completed"


async def _status(pid: int, wanted: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if psutil.Process(pid).status() == wanted:
            return True
        await asyncio.sleep(0.05)
    return False
