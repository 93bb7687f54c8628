"""The installed `vigil` command against the four services: submit, wait, logs, events, actions,
tokens, analysers, and the errors a user meets (API down, token refused), each as one line
without a traceback. (`vigil pilots`: tests/e2e/test_pilots.py; `restart`, `recover` and
`wait`'s exit 3: tests/e2e/test_job_environment.py.)
"""

import importlib.util
import json
import re
import select
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

from bench.cluster import free_port
from tests.e2e.conftest import VIGIL, vigil
from tests.e2e.stack import Stack
from vigil import Client, Event

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "resubmit_on_signal.py"
WAIT_S = 60

JOB_YAML = """
name: greet
command: echo "hello $VIGIL_INPUT"
inputs: [a, b]
"""


@contextmanager
def following(env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """`vigil events args...`, yielded once it says its subscription is in place."""
    proc = subprocess.Popen(
        [str(VIGIL), "events", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 15)
        assert ready, "vigil events did not open its stream in 15 s"
        assert proc.stderr.readline().startswith("following "), proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_when_a_job_file_is_submitted__wait_exits_0_and_logs_show_its_output(
    env: dict[str, str], tmp_path: Path
) -> None:
    # given
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB_YAML)

    # when
    with following(env, "--count", "1", "job.succeeded.*") as events:
        submitted = vigil(env, "submit", str(job_file))
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        waited = vigil(env, "wait", job_id, "--timeout", str(WAIT_S))
        event_lines, _ = events.communicate(timeout=WAIT_S)

    # then
    assert job_id.startswith("j-")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert waited.stdout.strip() == f"job {job_id} completed: 2 completed"
    assert event_lines.startswith(f"job.succeeded.{job_id} {{")
    logs = vigil(env, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    texts = sorted(line.split(None, 2)[2] for line in logs.stdout.splitlines())
    assert texts == ["hello a", "hello b"]
    assert vigil(env, "logs", job_id, "-f", "--severity", "info").stdout == logs.stdout
    listed = vigil(env, "status")
    assert job_id in listed.stdout and "completed" in listed.stdout
    assert "e2e-host" in vigil(env, "hosts").stdout


def test_when_a_job_fails__wait_exits_1_and_status_shows_the_failed_task(
    env: dict[str, str], tmp_path: Path
) -> None:
    # given
    job_file = tmp_path / "failing.json"
    job_file.write_text('{"name": "failing", "command": "echo trying; exit 3", "inputs": ["x"]}')

    # when
    submitted = vigil(env, "submit", str(job_file), "--wait", "--timeout", str(WAIT_S))

    # then
    assert submitted.returncode == 1, submitted.stdout + submitted.stderr
    job_id, summary, *failed_table = submitted.stdout.splitlines()
    assert summary == f"job {job_id} failed: 1 failed_on_cluster"
    assert any("failed_on_cluster" in row and "exit" in row for row in failed_table)
    status = vigil(env, "status", job_id)
    assert status.returncode == 0 and "failed tasks" in status.stdout
    task_id = next(w for w in status.stdout.split() if w.startswith("t-"))
    assert "trying" in vigil(env, "logs", job_id, "--task", task_id).stdout
    recovered = vigil(env, "recover", task_id)
    assert recovered.stdout.strip() == f"task {task_id}: recover accepted, now recover_cluster"


def test_when_the_api_is_down_or_refuses_the_token__the_error_is_one_clear_line(
    env: dict[str, str],
) -> None:
    down = f"http://127.0.0.1:{free_port()}"

    unreachable = vigil(env | {"VIGIL_URL": down}, "status")
    refused = vigil(env | {"VIGIL_TOKEN": "not-the-token"}, "status")
    no_token = vigil({k: v for k, v in env.items() if k != "VIGIL_TOKEN"}, "wait", "j-1")
    missing = vigil(env, "status", "j-000000000000")

    assert unreachable.returncode == 4
    assert unreachable.stderr.startswith(f"vigil: cannot reach the Vigil API at {down}: ")
    assert refused.returncode == 2
    assert refused.stderr.startswith("vigil: the API refused the token (401): set VIGIL_TOKEN")
    assert no_token.returncode == 2
    assert no_token.stderr.startswith("vigil: no token is set and the API requires one (401)")
    assert missing.returncode == 5
    assert missing.stderr == "vigil: job 'j-000000000000' not found (404)\n"
    for result in (unreachable, refused, no_token, missing):
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_when_an_operator_controls_a_running_job__each_command_says_what_it_did(
    stack: Stack, env: dict[str, str]
) -> None:
    # given: a job whose task is running
    with (
        Client(stack.base_url, stack.token) as client,
        client.subscribe(["task.on_cpu.*"]) as started,
    ):
        job_id = client.submit({"name": "long", "command": "sleep 60"})["id"]
        assert next(started).routing_key == f"task.on_cpu.{job_id}"

    # when / then
    throttled = vigil(env, "throttle", job_id, "--max-in-flight", "2", "--release-per-tick", "1")
    assert throttled.stdout == f"job {job_id}: throttle accepted, now active\n"
    assert vigil(env, "suspend", job_id).stdout.endswith("now suspended\n")
    assert vigil(env, "resume", job_id).stdout.endswith("now active\n")
    stopped = vigil(env, "emergency-stop", "--reason", "e2e drill")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.endswith("in force: 1 job(s) suspended, 1 task(s) killed\n")
    again = vigil(env, "emergency-stop", "--reason", "twice")
    assert again.returncode == 1 and "(409)" in again.stderr
    resumed = vigil(env, "resume-all")
    assert resumed.stdout.endswith("lifted: 1 job(s) resumed, 1 task(s) recovered\n")
    assert vigil(env, "cancel", job_id).stdout == f"job {job_id}: cancel accepted, now cancelled\n"
    assert vigil(env, "wait", job_id).returncode == 2


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("resubmit_on_signal", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_when_the_documented_resubmission_rule_runs__a_killed_task_is_duplicated_twice(
    stack: Stack, env: dict[str, str]
) -> None:
    # given: the rule of docs/examples, listening before the job exists
    client = Client(stack.base_url, stack.token)
    _example().install(client)
    failures: list[str] = []

    @client.on("task.failed_on_cluster.*")
    def count(event: Event) -> None:
        failures.append(event.body["task_id"])
        if len(failures) == 3:
            client.stop_listening()

    subscribed = threading.Event()
    listener = threading.Thread(
        target=client.listen, kwargs={"on_open": subscribed.set}, daemon=True
    )
    listener.start()
    assert subscribed.wait(15), "the event stream did not open"

    # when: every run of the command is killed by SIGKILL
    job_id = client.submit({"name": "killed", "command": "kill -9 $$", "inputs": ["x"]})["id"]
    listener.join(WAIT_S)

    # then: the original and two duplicates failed, and no third duplicate was made
    states = [(t["id"], t["state"]) for t in client.tasks(job_id)]
    assert not listener.is_alive(), f"saw {len(failures)} failure(s) of 3; tasks: {states}"
    waited = vigil(env, "wait", job_id, "--timeout", str(WAIT_S))
    assert waited.returncode == 1, waited.stdout + waited.stderr
    tasks = client.tasks(job_id)
    client.close()
    assert [t["id"] for t in tasks] == failures
    assert {(t["input"], t["state"], t["failure_class"], t["signal"]) for t in tasks} == {
        ("x", "failed_on_cluster", "signal", 9)
    }


def test_a_script_reads_every_record_as_json_and_tables_to_a_pipe_keep_whole_ids(
    env: dict[str, str], tmp_path: Path
) -> None:
    # given a job submitted with --json and waited for with --json
    job_file = tmp_path / "job.yaml"
    long_name = "a-campaign-name-" + "x" * 90  # wider than any terminal
    job_file.write_text(JOB_YAML.replace("name: greet", f"name: {long_name}"))
    submitted = vigil(env, "submit", str(job_file), "--json", "--wait", "--timeout", str(WAIT_S))
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)  # one document: the job as it ended
    assert (job["name"], job["state"]) == (long_name, "completed")

    # when each record command is asked for --json
    status = json.loads(vigil(env, "status", job["id"], "--json").stdout)
    listed = json.loads(vigil(env, "status", "--json", "--name", long_name).stdout)
    hosts = json.loads(vigil(env, "hosts", "--json").stdout)
    outputs = json.loads(vigil(env, "outputs", job["id"], "--json").stdout)
    logs = [
        json.loads(line) for line in vigil(env, "logs", job["id"], "--json").stdout.splitlines()
    ]
    fixed = json.loads(vigil(env, "fix", "hold", "--job", job["id"], "--dry-run", "--json").stdout)

    # then each is the API's record, with its own field names
    assert status["id"] == job["id"] and [j["id"] for j in listed] == [job["id"]]
    assert any(h["id"] == "e2e-host" for h in hosts) and outputs == []
    assert sorted(line["line"] for line in logs) == ["hello a", "hello b"]
    assert fixed["dry_run"] is True
    # and a table written to a pipe cuts nothing
    table = vigil(env, "status", "--name", long_name).stdout
    assert long_name in table and job["id"] in table


def test_vigil_tasks_shows_each_task_as_it_ended_and_each_failure_keeps_its_cause(
    env: dict[str, str], tmp_path: Path
) -> None:
    # given: one input that reports progress to 100, one that logs an error and exits 3, one
    # that bash cannot parse (each input is the command's own script)
    inputs = tmp_path / "scripts.jsonl"
    inputs.write_text(
        json.dumps("for i in $(seq 1 20); do echo PROGRESS: $((i * 5)); done") + "\n"
        + json.dumps("echo 'ERROR: no input'; exit 3") + "\n"
        + json.dumps('echo "unterminated') + "\n"
    )  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text('name: causes\ncommand: eval "$VIGIL_INPUT"\n')

    # when
    submitted = vigil(env, "submit", str(job_file), "--inputs-file", str(inputs))
    job_id = submitted.stdout.strip()
    waited = vigil(env, "wait", job_id, "--timeout", str(WAIT_S))
    listed = vigil(env, "tasks", job_id)
    failed = vigil(env, "tasks", job_id, "--state", "failed_on_cluster", "--json")

    # then
    assert submitted.returncode == 0 and submitted.stderr == "", submitted.stderr
    assert waited.returncode == 1, waited.stdout + waited.stderr
    _, *rows = listed.stdout.splitlines()
    cells = [row.split() for row in rows]
    assert [(c[1], c[2], c[5], c[6], c[7]) for c in cells] == [
        ("0", "completed", "100%", "0", "-"),
        ("1", "failed_on_cluster", "-", "3", "error_log"),
        ("2", "failed_on_cluster", "-", "2", "exit"),
    ]
    assert all(c[3] == "e2e-host" and re.fullmatch(r"\d+:\d\d", c[4]) for c in cells)
    briefs = {t["index"]: t["error_brief"] for t in json.loads(failed.stdout)}
    assert briefs == {
        1: "error logged: ERROR: no input",
        2: "command exited with code 2: a shell syntax error:"
        " bash: eval: line 1: unexpected EOF while looking for matching `\"'",
    }


def _waiting_reason(client: Client, task_id: str, within_s: float = 30.0) -> str | None:
    """The reason the scheduler gave the task for waiting, once it gave one (None if it ran)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        task = client.task(task_id)
        why = task.get("waiting_reason")
        if task["state"] != "new" or (why and why["reason"] not in ("pending", "starting")):
            return str(why["reason"]) if task["state"] == "new" and why else None
        time.sleep(0.1)
    raise TimeoutError(f"task {task_id} was given no waiting reason in {within_s} s")


def test_vigil_why_says_each_reason_once(stack: Stack, env: dict[str, str]) -> None:
    # given: a job of priority 10 whose two tasks each need the whole host (one runs, one
    # waits), then a job of priority 0 of the same user, which waits behind it
    with Client(stack.base_url, stack.token) as client:
        [host] = client.hosts()
        whole = {"cpus": host["capacity"]["cpus"]}
        high = client.submit(
            {"command": "sleep 60", "inputs": ["a", "b"], "priority": 10, "resources": whole}
        )["id"]
        low = client.submit({"command": "true", "inputs": ["x"], "resources": whole})["id"]
        [task] = client.tasks(low)
        try:
            assert _waiting_reason(client, task["id"]) == "priority"

            # when
            why_task = vigil(env, "why", task["id"])
            why_job = vigil(env, "why", low)
        finally:
            for job_id in (high, low):
                client.job_action(job_id, "cancel")

    # then: the reason, then its message without its own label again
    ahead = "priority: 1 task of the user's higher-ranked jobs ahead"
    assert why_task.returncode == 0, why_task.stderr
    assert f"waiting: {ahead}" in why_task.stdout.splitlines()[0], why_task.stdout
    assert f"1 task(s) waiting: {ahead}" in why_job.stdout.splitlines(), why_job.stdout


def test_an_operator_issues_a_token_that_works_and_lists_the_analysers(
    env: dict[str, str],
) -> None:
    # given a user of the stack
    added = vigil(env, "add-user", "cli-newtoken", "--label", "first")
    assert added.returncode == 0, added.stderr

    # when an operator asks for one more token, and for the analysers
    issued = vigil(env, "new-token", "cli-newtoken", "--label", "laptop")
    listed = vigil(env, "analysers")
    as_json = vigil(env, "analysers", "--json")

    # then the token is alone on stdout (`TOKEN=$(vigil new-token bob)`), its id on stderr,
    # and it works; the analysers list `default` one a line, and as a JSON list
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.removesuffix("\n")
    assert token and "\n" not in token and " " not in token, issued.stdout
    assert re.fullmatch(
        r"token k-\S+ for cli-newtoken \(shown once: keep it now\)\n", issued.stderr
    )
    tokens = vigil(env, "tokens", "cli-newtoken", "--json")
    assert sorted(t["label"] for t in json.loads(tokens.stdout)) == ["first", "laptop"]
    as_user = vigil(env | {"VIGIL_TOKEN": token}, "status")
    assert as_user.returncode == 0, as_user.stderr
    denied = vigil(env | {"VIGIL_TOKEN": token}, "new-token", "cli-newtoken")
    assert denied.returncode == 1 and "(403)" in denied.stderr, denied.stderr
    assert listed.returncode == 0, listed.stderr
    assert "default" in listed.stdout.splitlines()
    assert json.loads(as_json.stdout) == listed.stdout.splitlines()
