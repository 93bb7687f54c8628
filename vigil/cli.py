"""`vigil`: the command-line client. Every command goes through `vigil.client.Client`.

Ids say what they name: `j-...` is a job, `t-...` a task. Exit codes: see `vigil.session`.
"""

import functools
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec

import typer
from rich.console import Console

from vigil import fixes, harvest, jobfile, render
from vigil.client import Client
from vigil.errors import Conflict, UsageError, VigilError
from vigil.session import EXIT_BY_STATE, Session, explain
from vigil.states import TASK_FAILED

#: Tables written to a pipe or a file are as wide as their cells (a terminal's width would cut
#: ids, names and paths, and a script needs them whole).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 100_000)
err = Console(stderr=True, highlight=False)


app = typer.Typer(
    help="Submit, watch and control Vigil jobs. Ids: j-... is a job, t-... a task.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

P = ParamSpec("P")

#: `--json`: one JSON document on stdout (JSON lines for what streams), with the API's own
#: field names, never cut; hints and progress go to stderr.
JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON document, nothing else.")]


def _json(value: Any) -> None:
    print(json.dumps(value), flush=True)


def command(name: str | None = None) -> Callable[[Callable[P, None]], Callable[P, None]]:
    """`app.command`, with every `VigilError` shown as one line on stderr and an exit code."""

    def register(fn: Callable[P, None]) -> Callable[P, None]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                fn(*args, **kwargs)
            except BrokenPipeError:
                # The reader went away (`vigil logs JOB | head`): stop quietly, as cat does.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(0) from None
            except VigilError as exc:
                session = _session_of(kwargs.get("ctx"))
                message, code = explain(exc, session.found if session else None)
                print(f"vigil: {render.printable(message)}", file=sys.stderr)
                raise typer.Exit(code) from None

        app.command(name)(run)
        return run

    return register


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(help="The API's URL (default: VIGIL_URL, the config file, or :8000)."),
    ] = None,
) -> None:
    """Configuration: VIGIL_URL and VIGIL_TOKEN, else ~/.config/vigil/config.toml (or the
    file named by VIGIL_CONFIG) with `url = "..."` and `token = "..."`."""
    ctx.obj = Session(url)


def _session_of(ctx: Any) -> Session | None:
    # Typer hands commands its own click Context, not always a `typer.Context` instance.
    find = getattr(ctx, "find_object", None)
    return find(Session) if find is not None else None


def _session(ctx: typer.Context) -> Session:
    session = ctx.find_object(Session)
    assert session is not None  # made by `main` for every command
    return session


def _kind(some_id: str) -> str:
    if some_id.startswith("j-"):
        return "job"
    if some_id.startswith("t-"):
        return "task"
    raise UsageError(f"{some_id!r} is neither a job id (j-...) nor a task id (t-...)")


def _expect(kind: str, some_id: str, command: str) -> str:
    if _kind(some_id) != kind:
        raise UsageError(f"{command} takes a {kind} id, not {some_id!r}")
    return some_id


# -- submitting and watching ------------------------------------------------------------------


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
    configuring: Annotated[
        bool,
        typer.Option(
            "--configuring", help="Hold the inputs: only `vigil test` runs until `vigil activate`."
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit the job in FILE and print its id (--json: the job; with --wait, as it ended)."""
    if configuring and wait:
        raise UsageError(
            "--wait with --configuring would wait for ever: nothing but tests runs"
            " until `vigil activate`"
        )
    body = jobfile.load(file)
    if configuring:
        body["configuring"] = True
    with _session(ctx).client() as client:
        job = client.submit(body, idempotency_key)
        if not as_json:
            print(render.printable(job["id"]), flush=True)
        elif not wait:
            _json(job)
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
    _expect("job", job_id, "test")
    if input_index is not None and input_json is not None:
        raise UsageError("give --input-index or --input, not both")
    test_input: dict[str, Any] = {}
    if input_index is not None:
        test_input["input_index"] = input_index
    elif input_json is not None:
        test_input["input"] = jobfile.json_or_text(input_json)
    with _session(ctx).client() as client:
        task = client.test(job_id, **test_input)
    if as_json:
        _json(task)
    else:
        print(render.printable(task["id"]))


@command()
def activate(ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="JOB")]) -> None:
    """Put a configuring job into production: its tasks are made from the held inputs."""
    _job_action(ctx, _expect("job", job_id, "activate"), "activate")


@command()
def edit(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB")],
    file: Annotated[Path, typer.Argument(help="YAML or JSON: the fields to change.")],
) -> None:
    """Change fields of a job (a configuring one: anything; an active one: the throttle and
    the policy's budgets). `policy` in FILE names only the policy fields that change."""
    _expect("job", job_id, "edit")
    changes = jobfile.load(file)
    with _session(ctx).client() as client:
        job = client.edit(job_id, **changes)
    print(render.printable(f"job {job['id']}: edited ({', '.join(sorted(changes))})"))


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
    """List jobs; or show one job (tasks per state, failed tasks) or one task (attempts).

    --json: the list of jobs, or the job as `GET /jobs/{id}` gives it, or the task."""
    with _session(ctx).client() as client:
        if some_id is None:
            wanted = state.value if state else None
            page = client.jobs_page(state=wanted, name=name, limit=limit)
            if as_json:
                _json(page["items"])
            else:
                out.print(render.jobs_table(page["items"]))
            if page["next_cursor"] is not None:
                print(f"(the {limit} newest shown; --limit for more)", file=sys.stderr)
        elif _kind(some_id) == "job":
            job = client.job(some_id)
            if as_json:
                _json(job)
                return
            failed = [t for t in client.tasks(some_id) if t["state"] in TASK_FAILED]
            out.print(*render.job_detail(job, failed))
        elif as_json:
            _json(client.task(some_id))
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
    _expect("job", job_id, "wait")
    with _session(ctx).client() as client:
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
        _json(job)
        raise typer.Exit(EXIT_BY_STATE[job["state"]])
    print(render.job_summary(job))
    if job["state"] == "failed":
        failed = [t for t in client.tasks(job_id) if t["state"] in TASK_FAILED]
        out.print(render.failed_table(failed))
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
    _expect("job", job_id, "logs")
    if task is not None:
        _expect("task", task, "--task")
    with _session(ctx).client() as client:
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

    with _session(ctx).client() as client:
        for event in client.follow(topics, since=after, reconnect=follow, on_open=opened):
            if as_json:
                _json({"seq": event.seq, "routing_key": event.routing_key, "body": event.body})
            else:
                print(render.event_line(event), flush=True)
            seen += 1
            if count is not None and seen >= count:
                return


# -- acting on jobs and tasks -----------------------------------------------------------------


def _task_action(ctx: typer.Context, task_id: str, action: str) -> None:
    with _session(ctx).client() as client:
        done = client.task_action(task_id, action)
    task = done["task"]
    line = f"task {task['id']}: {action} accepted, now {task['state']}"
    if done.get("created"):
        line += f"; new task {done['created']['id']}"
    print(render.printable(line))


def _job_action(ctx: typer.Context, job_id: str, action: str, **fields: Any) -> None:
    with _session(ctx).client() as client:
        job = client.job_action(job_id, action, **fields)
    print(render.printable(f"job {job['id']}: {action} accepted, now {job['state']}"))


IdArg = Annotated[str, typer.Argument(metavar="JOB|TASK")]
JobArg = Annotated[str, typer.Argument(metavar="JOB")]
TaskArg = Annotated[str, typer.Argument(metavar="TASK")]


@command()
def recover(ctx: typer.Context, some_id: IdArg) -> None:
    """Recover a failed task, or every failed task of a job."""
    if _kind(some_id) == "task":
        _task_action(ctx, some_id, "recover")
    else:
        _job_action(ctx, some_id, "recover_failed")


class RestartStage(StrEnum):
    """`--stage` choices: `restart_<stage>` task actions."""

    SETUP = "setup"
    CLUSTER = "cluster"
    POST_PROCESSING = "post_processing"


@command()
def restart(
    ctx: typer.Context,
    task_id: TaskArg,
    stage: Annotated[RestartStage, typer.Option(help="The stage to run again from.")],
) -> None:
    """Run a task again from a stage (a completed or failed task)."""
    _task_action(ctx, _expect("task", task_id, "restart"), f"restart_{stage.value}")


@command()
def cancel(ctx: typer.Context, some_id: IdArg) -> None:
    """Cancel a task, or a whole job."""
    if _kind(some_id) == "task":
        _task_action(ctx, some_id, "cancel")
    else:
        _job_action(ctx, some_id, "cancel")


@command()
def suspend(ctx: typer.Context, job_id: JobArg) -> None:
    """Release no more tasks of the job (running ones go on)."""
    _job_action(ctx, _expect("job", job_id, "suspend"), "suspend")


@command()
def resume(ctx: typer.Context, job_id: JobArg) -> None:
    """Release the tasks of a suspended job again."""
    _job_action(ctx, _expect("job", job_id, "resume"), "resume")


@command()
def throttle(
    ctx: typer.Context,
    job_id: JobArg,
    max_in_flight: Annotated[int | None, typer.Option(min=1, help="Most tasks at once.")] = None,
    release_per_tick: Annotated[
        int | None, typer.Option(min=1, help="Most new tasks released per scheduler tick.")
    ] = None,
) -> None:
    """Limit how many of the job's tasks run at once and how fast new ones start."""
    _expect("job", job_id, "throttle")
    if max_in_flight is None and release_per_tick is None:
        raise UsageError("throttle needs --max-in-flight and/or --release-per-tick")
    _job_action(
        ctx, job_id, "throttle", max_in_flight=max_in_flight, release_per_tick=release_per_tick
    )


# -- results and cleanup ----------------------------------------------------------------------


@command()
def outputs(ctx: typer.Context, job_id: JobArg, as_json: JsonFlag = False) -> None:
    """List the job's output files: task, name, size, sha256, downloadable, where they are."""
    _expect("job", job_id, "outputs")
    with _session(ctx).client() as client:
        found = list(client.outputs(job_id))
    if as_json:
        _json(found)
    else:
        out.print(harvest.outputs_table(found))


@command()
def download(
    ctx: typer.Context,
    task_id: TaskArg,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The output's file name.")],
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", metavar="FILE", help="Save here (- for stdout)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE.")] = False,
) -> None:
    """Save output NAME of a task, to NAME in the current directory by default."""
    _expect("task", task_id, "download")
    where = harvest.target(name, output, force)
    with _session(ctx).client() as client:
        data = client.download(task_id, name)
    harvest.save(data, where)
    if where != harvest.STDOUT:
        print(render.printable(f"saved {len(data)} bytes to {where}"), file=sys.stderr)


@command()
def purge(
    ctx: typer.Context,
    job_id: JobArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Delete an ended job's logs, kept outputs and work dirs for good."""
    _expect("job", job_id, "purge")
    if not yes and not (
        sys.stdin.isatty()
        and typer.confirm(f"purge {job_id}: its logs, kept outputs and work dirs go for good?")
    ):
        raise UsageError("purge deletes the job's data for good: confirm it, or repeat with --yes")
    with _session(ctx).client() as client:
        job = client.purge(job_id)
    print(render.printable(f"job {job['id']}: purged at {job['purged_at']}"))


# -- operators --------------------------------------------------------------------------------


class HostVerb(StrEnum):
    """What `vigil hosts VERB HOST` does to a host (operators only)."""

    DRAIN = "drain"  # finish what it holds, take nothing new
    UNDRAIN = "undrain"
    QUARANTINE = "quarantine"  # take nothing new for --duration (a wall, not a breaker)
    RELEASE = "release"  # end its quarantine


@command()
def hosts(
    ctx: typer.Context,
    verb: Annotated[
        HostVerb | None, typer.Argument(help="drain, undrain, quarantine or release HOST.")
    ] = None,
    host: Annotated[str | None, typer.Argument(help="The host's id.")] = None,
    reason: Annotated[str, typer.Option(help="Why (quarantine).")] = "",
    duration: Annotated[
        float | None, typer.Option(min=1, help="Seconds a quarantine lasts (default: 7 days).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the worker hosts; or drain, undrain, quarantine or release one."""
    if verb is None:
        with _session(ctx).client() as client:
            found = client.hosts()
        if as_json:
            _json(found)
        else:
            out.print(render.hosts_table(found))
        return
    if host is None:
        raise UsageError(f"vigil hosts {verb.value} needs a HOST")
    fields: dict[str, Any] = {}
    if verb is HostVerb.QUARANTINE:
        fields = {"reason": reason, "duration_s": duration}
    with _session(ctx).client() as client:
        done = client.host_action(host, verb.value, **fields)
    if as_json:
        _json(done)
    else:
        print(render.printable(f"host {host}: {verb.value} accepted"))


@command()
def analysers(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the analysers a job's policy may name."""
    with _session(ctx).client() as client:
        found = client.analysers()
    if as_json:
        _json(found)
    else:
        for name in found:
            print(render.printable(name))


@command("emergency-stop")
def emergency_stop(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option(help="Why: kept with the stop.")],
) -> None:
    """Suspend every job and kill all running work (operators)."""
    with _session(ctx).client() as client:
        stop = client.emergency_stop(reason)
    print(render.printable(render.stop_summary(stop)))


@command("resume-all")
def resume_all(ctx: typer.Context) -> None:
    """Lift an emergency stop (operators)."""
    with _session(ctx).client() as client:
        resumed = client.resume_all()
    print(render.printable(render.resume_summary(resumed)))


# -- accounts (operators) ---------------------------------------------------------------------


def _issued(issued: dict[str, Any]) -> None:
    """A token just made: alone on stdout (`TOKEN=$(vigil add-user bob)`), its id on stderr."""
    details = issued.get("details") or {}
    print(
        f"token {render.printable(details.get('id'))} for {render.printable(details.get('user'))}"
        " (shown once: keep it now)",
        file=sys.stderr,
    )
    print(issued["token"])


@command()
def users(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the users: role, live tokens, disabled (operators)."""
    with _session(ctx).client() as client:
        found = client.users()
    if as_json:
        _json(found)
    else:
        out.print(render.users_table(found))


@command("add-user")
def add_user(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The new user's name.")],
    operator: Annotated[bool, typer.Option("--operator", help="An operator, not a user.")] = False,
    label: Annotated[str | None, typer.Option(help="What the first token is for.")] = None,
) -> None:
    """Create a user and print their first token (operators)."""
    with _session(ctx).client() as client:
        _issued(client.add_user(name, "operator" if operator else "user", label))


@command()
def tokens(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A user's name.")],
    as_json: JsonFlag = False,
) -> None:
    """List a user's tokens by id, revoked ones included (operators)."""
    with _session(ctx).client() as client:
        found = client.tokens(name)
    if as_json:
        _json(found)
    else:
        out.print(render.tokens_table(found))


@command("new-token")
def new_token(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A user's name.")],
    label: Annotated[str | None, typer.Option(help="What the token is for.")] = None,
) -> None:
    """Print one more token for a user (operators)."""
    with _session(ctx).client() as client:
        _issued(client.new_token(name, label))


@command("revoke-token")
def revoke_token(
    ctx: typer.Context, token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID")]
) -> None:
    """Revoke a token by its id (k-...): it stops working at once (operators)."""
    with _session(ctx).client() as client:
        token = client.revoke_token(token_id)
    print(f"revoked {render.printable(token.get('id'))} of {render.printable(token.get('user'))}")


@command("disable-user")
def disable_user(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """Disable a user: none of their tokens works any more (operators)."""
    with _session(ctx).client() as client:
        client.disable_user(name)
    print(f"disabled {render.printable(name)}")


# -- global fixes -----------------------------------------------------------------------------


@command()
def fix(
    ctx: typer.Context,
    action: Annotated[fixes.FixAction, typer.Argument(help="The task action to apply.")],
    state: Annotated[
        list[str] | None, typer.Option(help="Tasks in this state (repeatable).")
    ] = None,
    failure_class: Annotated[
        list[fixes.FailureClass] | None,
        typer.Option("--class", help="Tasks whose failure has this class (repeatable)."),
    ] = None,
    host: Annotated[list[str] | None, typer.Option(help="Tasks on this host (repeatable).")] = None,
    job: Annotated[list[str] | None, typer.Option(help="Tasks of this job (repeatable).")] = None,
    job_name: Annotated[
        str | None, typer.Option(help="Tasks of jobs named like this glob (* and ?).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Tasks last changed since: 2h, 1d or an ISO time.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Tasks last changed before then.")] = None,
    include_superseded: Annotated[
        bool,
        typer.Option(
            "--include-superseded", help="Also failed tasks already replaced by a resubmission."
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Change nothing; show.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Confirm acting on many tasks.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Apply ACTION to every task the options select, across jobs (a user: their own jobs).

    Options combine (all must hold); a repeated option matches any of its values.
    """
    chosen = fixes.selector(
        states=state or (),
        classes=[c.value for c in failure_class or ()],
        hosts=host or (),
        jobs=job or (),
        job_name=job_name,
        since=since,
        until=until,
        include_superseded=include_superseded,
        now=datetime.now(UTC),
    )
    with _session(ctx).client() as client:
        try:
            result = client.bulk_action(action.value, chosen, dry_run=dry_run, confirm=yes)
        except Conflict as exc:
            raise Conflict(exc.status, fixes.confirm_hint(exc.message)) from None
    if as_json:
        _json(result)
        return
    print(fixes.summary(result))
    for line in fixes.refusal_lines(result):
        print(line)
    if result.get("sample"):
        out.print(fixes.sample_table(result))


@command("fixes")
def fixes_command(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Most records listed.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List the recorded bulk actions (`fix`), dry runs included, newest first."""
    with _session(ctx).client() as client:
        records = list(client.bulk_actions(limit=limit))
    if as_json:
        _json(records)
        return
    for record in records:
        print(fixes.record_line(record))


if __name__ == "__main__":  # python -m vigil.cli
    sys.exit(app())
