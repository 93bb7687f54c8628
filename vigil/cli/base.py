"""The `vigil` app and what its commands share: the output consoles, `--json`, the
command decorator (errors as one line and an exit code), the session, and id arguments."""

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec

import typer
from rich.console import Console

from vigil import render
from vigil.errors import UsageError, VigilError
from vigil.session import Session, explain

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


def print_json(value: Any) -> None:
    print(json.dumps(value), flush=True)


def command(
    name: str | None = None, *, negative_numbers: bool = False
) -> Callable[[Callable[P, None]], Callable[P, None]]:
    """`app.command`, with every `VigilError` shown as one line on stderr and an exit code.

    `negative_numbers`: an argument may be a negative number (`vigil priority JOB -5`), which
    click would otherwise take for an unknown option."""
    settings = {"ignore_unknown_options": True} if negative_numbers else None

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

        app.command(name, context_settings=settings)(run)
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


def session(ctx: typer.Context) -> Session:
    session = ctx.find_object(Session)
    assert session is not None  # made by `main` for every command
    return session


def id_kind(some_id: str) -> str:
    if some_id.startswith("j-"):
        return "job"
    if some_id.startswith("t-"):
        return "task"
    raise UsageError(f"{some_id!r} is neither a job id (j-...) nor a task id (t-...)")


def expect_id(kind: str, some_id: str, command: str) -> str:
    if id_kind(some_id) != kind:
        raise UsageError(f"{command} takes a {kind} id, not {some_id!r}")
    return some_id


IdArg = Annotated[str, typer.Argument(metavar="JOB|TASK")]
JobArg = Annotated[str, typer.Argument(metavar="JOB")]
TaskArg = Annotated[str, typer.Argument(metavar="TASK")]


def task_action(ctx: typer.Context, task_id: str, action: str) -> None:
    with session(ctx).client() as client:
        done = client.task_action(task_id, action)
    task = done["task"]
    line = f"task {task['id']}: {action} accepted, now {task['state']}"
    if done.get("created"):
        line += f"; new task {done['created']['id']}"
    print(render.printable(line))


def job_action(ctx: typer.Context, job_id: str, action: str, **fields: Any) -> None:
    with session(ctx).client() as client:
        job = client.job_action(job_id, action, **fields)
    print(render.printable(f"job {job['id']}: {action} accepted, now {job['state']}"))
