"""Results and cleanup: `outputs`, `download`, `purge`."""

import sys
from typing import Annotated

import typer

from vigil import harvest, render
from vigil.cli.base import JobArg, JsonFlag, TaskArg, command, expect_id, out, print_json, session
from vigil.errors import UsageError

# -- results and cleanup ----------------------------------------------------------------------


@command()
def outputs(ctx: typer.Context, job_id: JobArg, as_json: JsonFlag = False) -> None:
    """List the job's output files: task, name, size, sha256, downloadable, where they are.

    A purged job has none any more: nothing is listed, and stderr says who purged it."""
    expect_id("job", job_id, "outputs")
    with session(ctx).client() as client:
        page = client.outputs_page(job_id)
        found = list(page["items"])
        while page["next_cursor"] is not None:
            page = client.outputs_page(job_id, cursor=page["next_cursor"])
            found += page["items"]
    purged = page.get("purged")
    if purged:
        print(f"vigil: {render.printable(purged)}", file=sys.stderr)
    if as_json:
        print_json(found)
    elif not purged:
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
    expect_id("task", task_id, "download")
    where = harvest.target(name, output, force)
    with session(ctx).client() as client:
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
    expect_id("job", job_id, "purge")
    if not yes and not (
        sys.stdin.isatty()
        and typer.confirm(f"purge {job_id}: its logs, kept outputs and work dirs go for good?")
    ):
        raise UsageError("purge deletes the job's data for good: confirm it, or repeat with --yes")
    with session(ctx).client() as client:
        job = client.purge(job_id)
    print(render.printable(f"job {job['id']}: purged at {job['purged_at']}"))
