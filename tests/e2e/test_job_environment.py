"""What a job sees of itself: its whole environment, as its command prints it, compared with
what the API says of its task over plain HTTP, across a recovery and a restart (the try, the
attempt and the run change), driven by the installed `vigil` command as a user drives it."""

import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import vigil
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.defaults]  # the job sees what a user's job sees

WAIT_S = 60

#: The `VIGIL_*` variables a command may see: README and docs/how-to/task-types.md
#: (`VIGIL_GPUS` only on a host with GPUs, docs/explanation/scheduling.md).
DOCUMENTED = {
    "VIGIL_JOB_ID",
    "VIGIL_TASK_ID",
    "VIGIL_TASK_INDEX",
    "VIGIL_INPUT",
    "VIGIL_TRY",
    "VIGIL_RUN_NUMBER",
    "VIGIL_ATTEMPT",
    "VIGIL_WORKDIR",
    "VIGIL_STATUS_FILE",
    "VIGIL_RESUME",
    "VIGIL_MARK",
    "VIGIL_GPUS",
}


def _environment(dump: Path) -> dict[str, str]:
    """An `env -0` dump as a dict (a value may hold any byte but NUL)."""
    pairs = [entry.partition("=") for entry in dump.read_text().split("\0") if entry]
    return {name: value for name, _, value in pairs}


def test_the_job_sees_the_ids_and_numbers_the_api_gives_its_task_across_recover_and_restart(
    stack: Stack, env: dict[str, str], shared_dir: Path, tmp_path: Path
) -> None:
    # given: a command that dumps its environment at each start, waits for the test's gate,
    # and fails on its first try only
    gate = shared_dir / "open"
    command = (
        f'env -0 > "{shared_dir}/env.$VIGIL_ATTEMPT"\n'
        f'until [ -e "{gate}" ]; do sleep 0.05; done\n'
        '[ "$VIGIL_TRY" -ge 2 ]\n'
    )
    job_file = tmp_path / "job.json"
    job_file.write_text(
        json.dumps({"name": "environment", "command": command, "inputs": ["frame-7"]})
    )
    submitted = vigil(env, "submit", str(job_file))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    # when: a wait that times out, then a failure (which restart refuses), a recover, a
    # restart of the completed task
    timed_out = vigil(env, "wait", job_id, "--timeout", "1")
    gate.touch()
    first = vigil(env, "wait", job_id, "--timeout", str(WAIT_S))
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.token}"}
    ) as http:
        [task] = http.get(f"/jobs/{job_id}/tasks").json()
        task_id = task["id"]
        refused = vigil(env, "restart", task_id, "--stage", "cluster")
        recovered = vigil(env, "recover", task_id)
        second = vigil(env, "wait", job_id, "--timeout", str(WAIT_S))
        restarted = vigil(env, "restart", task_id, "--stage", "cluster")
        third = vigil(env, "wait", job_id, "--timeout", str(WAIT_S))
        job = http.get(f"/jobs/{job_id}").json()
        task = http.get(f"/tasks/{task_id}").json()

    # then: each command exited as docs/reference/cli.md says
    assert timed_out.returncode == 3, timed_out.stdout + timed_out.stderr
    assert "Traceback" not in timed_out.stderr
    assert first.returncode == 1, first.stdout + first.stderr
    assert refused.returncode == 1 and refused.stderr.endswith("(409)\n"), refused.stderr
    assert f"recover it (`vigil recover {task_id}`)" in refused.stderr
    assert "restart it" not in refused.stderr  # the action it just refused
    assert recovered.stdout == f"task {task_id}: recover accepted, now recover_cluster\n"
    assert second.returncode == 0, second.stdout + second.stderr
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout == f"task {task_id}: restart_cluster accepted, now restart_cluster\n"
    assert third.returncode == 0, third.stdout + third.stderr
    assert (job["state"], task["state"]) == ("completed", "completed")

    # and: each start of the command saw its own task, its try, its run and its attempt
    starts = sorted(
        (a for a in task["attempts"] if a["stage"] == "cluster"), key=lambda a: a["attempt"]
    )
    dumps = sorted(shared_dir.glob("env.*"), key=lambda p: int(p.suffix[1:]))
    assert [int(p.suffix[1:]) for p in dumps] == [a["attempt"] for a in starts]
    for try_number, (dump, start) in enumerate(zip(dumps, starts, strict=True), start=1):
        seen = _environment(dump)
        assert {
            name: seen.get(name)
            for name in ("VIGIL_JOB_ID", "VIGIL_TASK_ID", "VIGIL_TASK_INDEX", "VIGIL_INPUT")
        } == {
            "VIGIL_JOB_ID": job["id"],
            "VIGIL_TASK_ID": task["id"],
            "VIGIL_TASK_INDEX": str(task["index"]),
            "VIGIL_INPUT": task["input"],
        }
        assert seen["VIGIL_ATTEMPT"] == str(start["attempt"])
        assert seen["VIGIL_RUN_NUMBER"] == str(start["run_number"])
        assert seen["VIGIL_TRY"] == str(try_number)
        assert seen["HOME"] == seen["VIGIL_WORKDIR"] == seen["PWD"] == task["workdir"]
        status_file = f"{task['workdir']}/.vigil/status.run{start['run_number']}.json"
        assert seen["VIGIL_STATUS_FILE"] == status_file
        assert seen["VIGIL_RESUME"] == ""
        assert {n for n in seen if n.startswith("VIGIL_")} <= DOCUMENTED, sorted(seen)
        # nothing of the control plane: no server URL, no token, no service setting
        secrets = (stack.database_url, stack.amqp_url, stack.redis_url, stack.token)
        leaked = [n for n, v in seen.items() if any(s in v for s in secrets)]
        assert leaked == [], f"the job sees the services' secrets in {leaked}"
    assert [s["run_number"] for s in starts] == [1, 1, 2]
    assert task["run_number"] == 2
