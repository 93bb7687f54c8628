"""The `vigil` command against a served api (no worker runs): inputs from a file at submission
and appended, what a submission is warned of, the input limit's next step, what a purged job
shows, and a job's tasks a line."""

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.store import db
from tests.installed_cli import Ran, run_vigil
from tests.integration import harvest_steps as given
from tests.integration.test_client import Served, served  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def vigil(served: Served, tmp_path: Path) -> Iterator[Any]:  # noqa: F811 (the fixture)
    """`vigil(*args, input=None)`: run the command as the plain user, to its end."""
    env = {
        "VIGIL_URL": served.url,
        "VIGIL_TOKEN": served.user_token,
        "VIGIL_CONFIG": "/dev/null",
        "HOME": str(tmp_path),
    }

    def run(*args: str, input: str | None = None) -> Ran:
        return run_vigil(list(args), env, input=input)

    yield run


def _inputs_of(served: Served, job_id: str) -> list[Any]:  # noqa: F811 (the fixture)
    with served.client() as client:
        return [task["input"] for task in client.tasks(job_id)]


def _job_file(tmp_path: Path, text: str = "command: echo $VIGIL_INPUT\n") -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_submit_takes_the_inputs_one_a_line_from_a_file(
    vigil: Any,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    inputs = tmp_path / "scenes.txt"
    inputs.write_bytes(b"scene 1\r\n\nscene 2\n  \n{not json}\n")

    result = vigil("submit", _job_file(tmp_path), "--inputs-file", str(inputs))

    assert result.exit_code == 0, result.output
    assert _inputs_of(served, result.stdout.strip()) == ["scene 1", "scene 2", "{not json}"]


def test_submit_takes_json_lines_by_the_files_name_or_from_stdin_with_jsonl(
    vigil: Any,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    inputs = tmp_path / "scenes.jsonl"
    inputs.write_text('{"scene": 1}\n7\n"a"\n')

    named = vigil("submit", _job_file(tmp_path), "--inputs-file", str(inputs))
    piped = vigil(
        "submit", _job_file(tmp_path), "--inputs-file", "-", "--jsonl", input="[1, 2]\nnull\n"
    )

    assert named.exit_code == 0 and piped.exit_code == 0, named.output + piped.output
    assert _inputs_of(served, named.stdout.strip()) == [{"scene": 1}, 7, "a"]
    assert _inputs_of(served, piped.stdout.strip()) == [[1, 2], None]


@pytest.mark.parametrize(
    ("job", "inputs", "message"),
    [
        ("command: x\ninputs: [a]\n", "b\n", "gives inputs already: give them there or with"),
        ("command: x\n", '{"a": 1}\n{"b": \n', "inputs.jsonl:2: not valid JSON"),
        ("command: x\n", "NaN\n", "inputs.jsonl:1: nan is not a JSON number"),
    ],
)
def test_submit_refuses_inputs_given_twice_or_not_json_naming_the_line(
    vigil: Any, tmp_path: Path, job: str, inputs: str, message: str
) -> None:
    (tmp_path / "inputs.jsonl").write_text(inputs)

    result = vigil(
        "submit", _job_file(tmp_path, job), "--inputs-file", str(tmp_path / "inputs.jsonl")
    )

    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_over_the_input_limit_the_refusal_says_how_to_add_the_rest_and_append_does(
    vigil: Any,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    # given: seven inputs, and an api that takes five a request
    (tmp_path / "all.txt").write_text("".join(f"in-{n}\n" for n in range(7)))
    (tmp_path / "first.txt").write_text("".join(f"in-{n}\n" for n in range(5)))
    (tmp_path / "rest.txt").write_text("in-5\nin-6\n")

    # when
    refused = vigil("submit", _job_file(tmp_path), "--inputs-file", str(tmp_path / "all.txt"))
    submitted = vigil("submit", _job_file(tmp_path), "--inputs-file", str(tmp_path / "first.txt"))
    job_id = submitted.stdout.strip()
    appended = vigil("append", job_id, str(tmp_path / "rest.txt"))

    # then
    assert refused.exit_code == 1, refused.output
    assert "7 inputs given; at most 5 are accepted in one request" in refused.stderr
    assert "POST /jobs/{id}/inputs (`vigil append JOB FILE`)" in refused.stderr
    assert appended.exit_code == 0, appended.output
    assert appended.stdout.strip() == f"job {job_id}: 2 input(s) appended, now active"
    assert _inputs_of(served, job_id) == [f"in-{n}" for n in range(7)]


def test_a_command_bash_cannot_parse_is_submitted_with_a_warning_on_stderr(
    vigil: Any, tmp_path: Path
) -> None:
    result = vigil("submit", _job_file(tmp_path, "command: echo 'unterminated\n"))

    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith("j-")  # the id alone: JOB=$(vigil submit ...)
    assert result.stderr.startswith("vigil: warning: command: bash cannot parse it")
    assert "unexpected EOF while looking for matching" in result.stderr


def test_a_purged_job_lists_no_outputs_and_its_status_says_it_was_purged(
    vigil: Any,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    # given: an ended job with an output, purged
    job_id = vigil("submit", _job_file(tmp_path)).stdout.strip()

    async def ended_with_an_output() -> None:
        async with db.open_pool(served.database_url, max_size=1) as pool, pool.acquire() as conn:
            [task_id] = await given.end(conn, job_id)
            await given.record(conn, task_id, "out.txt", b"result")

    asyncio.run(ended_with_an_output())
    assert "out.txt" in vigil("outputs", job_id).stdout
    assert vigil("purge", job_id, "--yes").exit_code == 0

    # when
    listed = vigil("outputs", job_id)
    as_json = vigil("outputs", job_id, "--json")
    status = vigil("status", job_id)

    # then
    assert (listed.exit_code, listed.stdout) == (0, "")
    assert listed.stderr.startswith(f"vigil: job {job_id} was purged at ")
    assert listed.stderr.rstrip().endswith("(purge action): its outputs are gone")
    assert as_json.stdout.strip() == "[]"
    assert "purge action): its logs, kept outputs and work dirs are gone" in status.stdout


def test_vigil_tasks_lists_a_task_a_line_filtered_by_state_or_as_json(
    vigil: Any,
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    # given: a job of three tasks: one ran (exit 3, error_log), one runs, one waits
    (tmp_path / "in.txt").write_text("a\nb\nc\n")
    job_id = vigil("submit", _job_file(tmp_path), "--inputs-file", str(tmp_path / "in.txt"))
    job_id = job_id.stdout.strip()

    async def given_states() -> list[str]:
        async with db.open_pool(served.database_url, max_size=1) as pool, pool.acquire() as conn:
            ids = await given.task_ids(conn, job_id)
            await given.put(
                conn, ids[0], state="failed_on_cluster", failure_class="error_log",
                exit_code=3, host="h1", progress=40, claim=None,
            )  # fmt: skip
            await given.put(conn, ids[1], state="on_cpu", host="h1", progress=70)
            await conn.execute(
                "INSERT INTO attempts (task_id, attempt, run_number, stage, started_at, ended_at)"
                " VALUES ($1, 1, 1, 'cluster', now() - interval '125 seconds',"
                " now() - interval '5 seconds'),"
                " ($2, 1, 1, 'cluster', now() - interval '1 hour', NULL)",
                ids[0],
                ids[1],
            )
            return ids

    ids = asyncio.run(given_states())

    # when
    listed = vigil("tasks", job_id)
    running = vigil("tasks", job_id, "--state", "on_cpu,failed_on_cluster", "--state", "queued")
    as_json = vigil("tasks", job_id, "--json", "--state", "new")

    # then
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split() == [
        "TASK",
        "INDEX",
        "STATE",
        "HOST",
        "ELAPSED",
        "PROGRESS",
        "EXIT",
        "CLASS",
    ]
    assert [row.split() for row in rows] == [
        [ids[0], "0", "failed_on_cluster", "h1", "2:00", "40%", "3", "error_log"],
        [ids[1], "1", "on_cpu", "h1", rows[1].split()[4], "70%", "-", "-"],
        [ids[2], "2", "new", "-", "-", "-", "-", "-"],
    ]
    assert rows[1].split()[4].startswith("1:00:")  # an hour in its stage, and counting
    assert [row.split()[0] for row in running.stdout.splitlines()[1:]] == ids[:2]
    [waiting] = json.loads(as_json.stdout)
    assert (waiting["id"], waiting["elapsed_s"], waiting["started_at"]) == (ids[2], None, None)
