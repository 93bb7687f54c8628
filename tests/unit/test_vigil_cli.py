"""The command line refuses bad arguments and configuration before any request, with exit 2."""

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from vigil import render, session
from vigil.cli import app

runner = CliRunner()


def _run(args: list[str], tmp_path: Path, **env: str) -> tuple[int, str]:
    # An address nothing listens on: any request would fail with exit 4, not 2.
    base = {"VIGIL_URL": "http://127.0.0.1:9", "VIGIL_CONFIG": "/dev/null", "HOME": str(tmp_path)}
    result = runner.invoke(app, args, env=base | env)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "x-1"], "neither a job id (j-...) nor a task id (t-...)"),
        (["recover", "abc"], "neither a job id"),
        (["restart", "j-1", "--stage", "setup"], "restart takes a task id, not 'j-1'"),
        (["wait", "t-1"], "wait takes a job id"),
        (["suspend", "t-1"], "suspend takes a job id"),
        (["logs", "j-1", "--task", "j-2"], "--task takes a task id"),
        (["throttle", "j-1"], "throttle needs --max-in-flight and/or --release-per-tick"),
        (["status", "j-../admin"], "not a valid job id"),
        (["events", "job failed"], "topic pattern"),
        (["test", "t-1"], "test takes a job id"),
        (["test", "j-1", "--input-index", "1", "--input", "x"], "--input-index or --input"),
        (["activate", "t-1"], "activate takes a job id"),
        (["submit", "job.yaml", "--configuring", "--wait"], "would wait for ever"),
        (["--url", "ftp://host", "status"], "not an http:// or https:// URL"),
        (["fix", "recover"], "at least one of --state, --class, --host, --job, --job-name"),
        (["fix", "recover", "--since", "yesterday"], "neither a duration before now"),
        (["fix", "recover", "--until", "99999999999w"], "neither a duration before now"),
        (["fix", "recover", "--job", "j-1/../x"], "not a valid job id"),
        (["revoke-token", "sk-live-abc"], "is not a token id"),
        (["tokens", "../root"], "is not a valid user name"),
        (["disable-user", "a b"], "is not a valid user name"),
        (["hosts", "drain"], "vigil hosts drain needs a HOST"),
        (["hosts", "undrain", "../etc"], "is not a valid host id"),
    ],
)
def test_when_an_argument_is_wrong__the_command_says_why_and_exits_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, output = _run(args, tmp_path)

    assert code == 2, output
    assert message in output
    assert output.startswith("vigil: ") and "Traceback" not in output


def test_when_the_job_file_is_not_a_job__submit_exits_2_naming_the_place(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("command: x\ninputs: [2024-01-05]\n")

    code, output = _run(["submit", str(job)], tmp_path)

    assert code == 2
    assert "inputs[0]" in output


def test_when_the_config_file_is_missing_or_wrong__the_command_exits_2(tmp_path: Path) -> None:
    code, output = _run(["status"], tmp_path, VIGIL_CONFIG=str(tmp_path / "none.toml"))
    assert (code, "does not exist" in output) == (2, True)

    bad = tmp_path / "bad.toml"
    bad.write_text("token = 3\n")
    code, output = _run(["status"], tmp_path, VIGIL_CONFIG=str(bad))
    assert (code, "token must be a string" in output) == (2, True)


def test_when_a_stage_is_not_one_of_the_three__the_usage_error_lists_them(tmp_path: Path) -> None:
    code, output = _run(["restart", "t-1", "--stage", "hook"], tmp_path)

    assert code == 2
    assert "setup" in output and "post_processing" in output


def test_when_text_from_the_api_holds_control_characters__they_are_shown_escaped() -> None:
    line = {"task_id": "t-1", "severity": "info", "line": "\x1b[2Jgone\rback\tok"}

    assert render.log_line(line) == "t-1 info     \\x1b[2Jgone\\x0dback\tok"


def test_the_exit_code_table_of_the_docs_is_the_one_the_command_uses() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md").read_text()
    table = doc.split("### Exit codes and errors", 1)[1].split("\n\n", 2)[1]
    documented = {int(line.split("|")[1]) for line in table.splitlines()[2:]}
    used = {
        0,
        session.EXIT_REFUSED,
        session.EXIT_USAGE,
        session.EXIT_TIMEOUT,
        session.EXIT_UNREACHABLE,
        session.EXIT_NOT_FOUND,
        *session.EXIT_BY_STATE.values(),
    }
    assert documented == used == {0, 1, 2, 3, 4, 5}


def test_vigil_hosts_tells_a_shut_breaker_a_probing_one_and_an_operators_quarantine_apart() -> None:
    base: dict[str, Any] = {"slots": 2, "running_tasks": 0, "quarantined": True}
    hosts: list[dict[str, Any]] = [
        base
        | {
            "id": "shut",
            "breaker": True,
            "quarantined_until": "2100-01-01T00:00:00Z",
            "quarantine_reason": "5 tasks lost within 600 s",
        },
        base | {"id": "probing", "breaker": True, "probing_since": "2100-01-01T00:00:00Z"},
        base | {"id": "walled", "quarantine_reason": "quarantined by ops: disk"},
        {"id": "open", "slots": 2, "running_tasks": 1, "quarantined": False},
    ]
    console = Console(width=300, record=True)
    console.print(render.hosts_table(hosts))
    lines = {line.split()[0]: line for line in console.export_text().splitlines()[1:]}

    assert "breaker shut until" in lines["shut"] and "5 tasks lost" in lines["shut"]
    assert "probing since" in lines["probing"] and "one task at a time" in lines["probing"]
    assert "yes: quarantined by ops: disk" in lines["walled"]
    assert lines["open"].rstrip().endswith("no")


def test_vigil_status_says_why_a_job_waits() -> None:
    job = {
        "id": "j-1",
        "state": "active",
        "waiting_on": "all 1 host(s) of pool default quarantined",
    }
    console = Console(width=200, record=True)
    for part in render.job_detail(job, []):
        console.print(part)

    assert "waiting on  all 1 host(s) of pool default quarantined" in console.export_text()


def test_vigil_status_says_a_job_was_purged_in_its_detail_and_in_the_list() -> None:
    job = {
        "id": "j-1",
        "name": "render",
        "state": "completed",
        "purged_at": "2026-11-27T08:00:00+00:00",
        "purged_by": "ops",
        "purge_reason": "purge action",
    }
    console = Console(width=200, record=True)
    for part in [*render.job_detail(job, []), render.jobs_table([job])]:
        console.print(part)

    shown = console.export_text()
    assert (
        "purged    2026-11-27 08:00:00 UTC by ops (purge action): its logs, kept outputs and"
        " work dirs are gone"
    ) in shown
    assert "completed, purged" in shown
