"""Submitting, trying and watching jobs: `submit`, `test`, `activate`, `edit`, `status`,
`wait`, `logs`, `events`."""

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from vigil import inputs_file as inputs_from_file
from vigil import jobfile, render
from vigil.cli.base import (
    JsonFlag,
    command,
    err,
    expect_id,
    id_kind,
    job_action,
    out,
    print_json,
    session,
)
from vigil.client import Client
from vigil.errors import UsageError
from vigil.session import EXIT_BY_STATE

# -- submitting and watching ------------------------------------------------------------------

#: `--inputs-file`: the job's inputs, one a line, from a file (not in the job file).
InputsFileOption = Annotated[
    str | None,
    typer.Option(
        "--inputs-file",
        metavar="FILE",
        help="The inputs, one a line (JSON lines for .jsonl or --jsonl; - for stdin).",
    ),
]
#: `--jsonl`: each line of an inputs file is a JSON value, whatever the file's name.
JsonLinesFlag = Annotated[
    bool, typer.Option("--jsonl", help="Each line of the inputs file is a JSON value.")
]


@command()
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A job file, YAML or JSON (.json).")],
    wait: Annotated[bool, typer.Option("--wait", help="Then wait for it, like `wait`.")] = False,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="With --wait: give up after this many seconds.")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Submitting again with the same key makes no new job.")
    ] = None,
    inputs_file: InputsFileOption = None,
    jsonl: JsonLinesFlag = False,
    configuring: Annotated[
        bool,
        typer.Option(
            "--configuring", help="Hold the inputs: only `vigil test` runs until `vigil activate`."
        ),
    ] = False,
    files: Annotated[
        list[Path] | None,
        typer.Option(
            "--file", help="A file of the job's own, placed read-only in each task's dir."
        ),
    ] = None,
    dirs: Annotated[
        list[Path] | None,
        typer.Option("--dir", help="A dir of the job's own files, placed read-only by its name."),
    ] = None,
    cpus: Annotated[
        float | None, typer.Option(min=0, help="CPUs each task needs (default 1; 0.5 allowed).")
    ] = None,
    memory_mb: Annotated[
        int | None, typer.Option(min=0, help="Memory each task needs, in MiB (default 0).")
    ] = None,
    gpus: Annotated[int | None, typer.Option(min=0, help="GPUs each task needs.")] = None,
    priority: Annotated[
        int | None,
        typer.Option(help="Its rank among your jobs (higher first; default 0)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Submit the job in FILE and print its id (--json: the job; with --wait, as it ended).
    The job's own files (its `files:` list, paths relative to FILE's dir, and each --file and
    --dir) are sent with it and placed read-only in every task's work dir; past 8 MiB in all,
    each one over 1 MiB is uploaded straight to the object store first (an S3 store's signed
    link) and named by its URL.

    What each task needs and the job's priority: FILE's `resources: {cpus, memory_mb, gpus}`
    and `priority:`; --cpus, --memory-mb, --gpus and --priority replace them one by one."""
    if configuring and wait:
        raise UsageError(
            "--wait with --configuring would wait for ever: nothing but tests runs"
            " until `vigil activate`"
        )
    body = jobfile.with_request(
        jobfile.load(file), cpus=cpus, memory_mb=memory_mb, gpus=gpus, priority=priority
    )
    if inputs_file is not None:
        if "inputs" in body:
            raise UsageError(
                f"{file} gives inputs already: give them there or with --inputs-file, not both"
            )
        body["inputs"] = inputs_from_file.load(inputs_file, jsonl=jsonl)
    if configuring:
        body["configuring"] = True
    with session(ctx).client() as client:
        body = jobfile.with_files(body, file.parent, files or [], dirs or [], client.upload)
        job = client.submit(body, idempotency_key)
        for warning in job.get("warnings", []):  # accepted, but told at once
            print(f"vigil: warning: {render.printable(warning)}", file=sys.stderr, flush=True)
        if not as_json:
            print(render.printable(job["id"]), flush=True)
        elif not wait:
            print_json(job)
        if wait:
            _wait(client, job["id"], timeout, as_json=as_json)


# -- trying a job before production ------------------------------------------------------------


@command("test")
def test_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    input_index: Annotated[
        int | None, typer.Option(min=0, help="Test the held input at this position (0 first).")
    ] = None,
    input_json: Annotated[
        str | None, typer.Option("--input", help="Test this input instead (JSON, or a string).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a test task of a configuring job and print its id (its outputs are thrown away
    when the job is activated)."""
    expect_id("job", job_id, "test")
    if input_index is not None and input_json is not None:
        raise UsageError("give --input-index or --input, not both")
    test_input: dict[str, Any] = {}
    if input_index is not None:
        test_input["input_index"] = input_index
    elif input_json is not None:
        test_input["input"] = jobfile.json_or_text(input_json)
    with session(ctx).client() as client:
        task = client.test(job_id, **test_input)
    if as_json:
        print_json(task)
    else:
        print(render.printable(task["id"]))


@command()
def activate(ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="JOB")]) -> None:
    """Put a configuring job into production: its tasks are made from the held inputs."""
    job_action(ctx, expect_id("job", job_id, "activate"), "activate")


@command()
def edit(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    file: Annotated[Path, typer.Argument(help="YAML or JSON: the fields to change.")],
) -> None:
    """Change fields of a job (a configuring one: anything; an active one: the throttle, the
    priority and the policy's budgets). `policy` in FILE names only the policy fields that
    change."""
    expect_id("job", job_id, "edit")
    changes = jobfile.load(file)
    with session(ctx).client() as client:
        job = client.edit(job_id, **changes)
    print(render.printable(f"job {job['id']}: edited ({', '.join(sorted(changes))})"))


@command()
def append(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    file: Annotated[
        str, typer.Argument(metavar="FILE", help="One input a line (`-`: standard input).")
    ],
    jsonl: JsonLinesFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Add a task to the job for each input in FILE (a finished job becomes active again).

    FILE holds one input a line, its text; JSON values, one a line, when it ends in .jsonl
    or with --jsonl. --json: the API's answer (the job and the new tasks' ids)."""
    expect_id("job", job_id, "append")
    inputs = inputs_from_file.load(file, jsonl=jsonl)
    if not inputs:
        raise UsageError(f"{file}: no inputs in it (blank lines are skipped)")
    with session(ctx).client() as client:
        added = client.append_inputs(job_id, inputs)
    if as_json:
        print_json(added)
        return
    job = added["job"]
    line = f"job {job['id']}: {len(added['task_ids'])} input(s) appended, now {job['state']}"
    print(render.printable(line))


class JobState(StrEnum):
    """`--state` choices (the server's `JobState`)."""

    CONFIGURING = "configuring"
    ACTIVE = "active"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@command()
def status(
    ctx: typer.Context,
    some_id: Annotated[str | None, typer.Argument(metavar="[JOB|TASK]")] = None,
    state: Annotated[JobState | None, typer.Option(help="Only jobs in this state.")] = None,
    name: Annotated[str | None, typer.Option(help="Only jobs of this name.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Most jobs listed.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List jobs; or show one job (tasks per state, failed tasks, tasks resubmitted as a
    clone) or one task (its lineage, the triage's decision, attempts).

    --json: the list of jobs, or the job as `GET /jobs/{id}` gives it, or the task."""
    with session(ctx).client() as client:
        if some_id is None:
            wanted = state.value if state else None
            page = client.jobs_page(state=wanted, name=name, limit=limit)
            if as_json:
                print_json(page["items"])
            else:
                out.print(render.jobs_table(page["items"]))
            if page["next_cursor"] is not None:
                print(f"(the {limit} newest shown; --limit for more)", file=sys.stderr)
        elif id_kind(some_id) == "job":
            job = client.job(some_id)
            if as_json:
                print_json(job)
                return
            tasks = client.tasks(some_id)
            out.print(*render.job_detail(job, render.failing(tasks), render.superseded(tasks)))
        elif as_json:
            print_json(client.task(some_id))
        else:
            out.print(*render.task_detail(client.task(some_id)))


@command("wait")
def wait_command(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Give up after this many seconds (exit 3).")
    ] = None,
) -> None:
    """Wait for the job to end, with a progress bar (exit 0 completed, 1 failed, 2 cancelled).

    Exit 3 when --timeout passes first.
    """
    expect_id("job", job_id, "wait")
    with session(ctx).client() as client:
        _wait(client, job_id, timeout)


def _wait(client: Client, job_id: str, timeout: float | None, *, as_json: bool = False) -> NoReturn:
    with render.progress(err) as bar:
        handle = bar.add_task(job_id, total=None)
        job = client.wait(
            job_id,
            on_progress=lambda view: bar.update(handle, **render.progress_fields(view)),
            timeout=timeout,
        )
    if as_json:
        print_json(job)
        raise typer.Exit(EXIT_BY_STATE[job["state"]])
    print(render.job_summary(job))
    if job["state"] == "failed":
        out.print(render.failed_table(render.failing(client.tasks(job_id))))
    raise typer.Exit(EXIT_BY_STATE[job["state"]])


class Severity(StrEnum):
    """`--severity` choices (the server's `Severity`; a unit test keeps them equal)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"
    FATAL = "fatal"


@command()
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    task: Annotated[str | None, typer.Option(help="Only this task's lines.")] = None,
    severity: Annotated[Severity | None, typer.Option(help="Only lines of this severity.")] = None,
    run: Annotated[int | None, typer.Option(min=1, help="Only this run of the tasks.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line, as the API gives it.")
    ] = False,
) -> None:
    """Print the job's output lines: task, severity, text."""
    expect_id("job", job_id, "logs")
    if task is not None:
        expect_id("task", task, "--task")
    with session(ctx).client() as client:
        level = severity.value if severity else None
        for line in client.logs(job_id, task=task, severity=level, run=run, follow=follow):
            if as_json:
                print(json.dumps(line), flush=follow)
            else:
                print(render.log_line(line), flush=follow)


@command()
def events(
    ctx: typer.Context,
    topics: Annotated[list[str], typer.Argument(metavar="TOPIC...", help="e.g. 'job.*.*'")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Reconnect when the stream breaks.")
    ] = False,
    count: Annotated[int | None, typer.Option("--count", "-n", min=1, help="Stop after N.")] = None,
    after: Annotated[
        int | None,
        typer.Option(
            "--after",
            min=0,
            help="Start after this event position (0: every event still kept), not from now.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='One {"seq", "routing_key", "body"} object per line.')
    ] = False,
) -> None:
    """Print events matching the topic patterns (`*` one word, `#` any): key and JSON body.

    A user names their own jobs by id (`job.*.j-...`); operators may use wildcards there.
    With --follow, a broken stream is reopened after the last position printed: no job or
    task event is missed or printed twice.
    """
    seen = 0

    def opened() -> None:
        print(f"following {' '.join(topics)}", file=sys.stderr, flush=True)

    with session(ctx).client() as client:
        for event in client.follow(topics, since=after, reconnect=follow, on_open=opened):
            if as_json:
                print_json({"seq": event.seq, "routing_key": event.routing_key, "body": event.body})
            else:
                print(render.event_line(event), flush=True)
            seen += 1
            if count is not None and seen >= count:
                return
