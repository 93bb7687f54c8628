"""Results and cleanup: `outputs`, `download`, `purge`."""

import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from vigil import harvest, render
from vigil.calls import check_id, check_output_name
from vigil.cli.base import (
    IdArg,
    JobArg,
    JsonFlag,
    command,
    expect_id,
    id_kind,
    out,
    print_json,
    session,
)
from vigil.client import Client
from vigil.errors import UsageError

#: Outputs of a job downloaded at once.
PARALLEL_DOWNLOADS: Final = 4

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
    some_id: IdArg,
    name: Annotated[
        str | None, typer.Argument(metavar="[NAME]", help="The output's file name (a task's).")
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", metavar="FILE", help="Save here (- for stdout)."),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", metavar="DIR", help="A job's outputs: save under DIR."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE.")] = False,
) -> None:
    """Save output NAME of a TASK (to NAME here, or -o FILE), or every output of a JOB's
    latest runs (to DIR/TASK/NAME; DIR is the job id unless --to), in parallel. A cut
    download is resumed where it stopped; every file is checked against its sha256."""
    if id_kind(some_id) == "job":
        if name is not None or output is not None:
            raise UsageError("a job's outputs go to a directory: download JOB [--to DIR]")
        _download_job(ctx, some_id, Path(to or some_id))
        return
    expect_id("task", some_id, "download")
    if name is None:
        raise UsageError("download TASK takes the output's NAME (or give a job id)")
    where = harvest.target(name, output, force)
    with session(ctx).client() as client:
        data = client.download(some_id, name)
    harvest.save(data, where)
    if where != harvest.STDOUT:
        print(render.printable(f"saved {len(data)} bytes to {where}"), file=sys.stderr)


def _download_job(ctx: typer.Context, job_id: str, to: Path) -> None:
    with session(ctx).client() as client:
        found = list(client.outputs(job_id))
        stored = [o for o in found if o.get("downloadable")]
        with ThreadPoolExecutor(max_workers=PARALLEL_DOWNLOADS) as pool:
            done = pool.map(lambda o: _fetch_one(client, o, to), stored)
            total = sum(done)
    skipped = len(found) - len(stored)
    print(render.printable(f"saved {len(stored)} outputs ({total} bytes) to {to}"))
    if skipped:
        print(f"vigil: {skipped} outputs recorded before the store are not kept", file=sys.stderr)


def _fetch_one(client: Client, output: Mapping[str, Any], to: Path) -> int:
    task_id, name = str(output["task_id"]), check_output_name(str(output["name"]))
    dest = to / check_id("task", task_id) / name
    fetched = client.download_file(task_id, name, dest, str(output["sha256"]))
    if fetched.resumed_from:
        line = f"{task_id}/{name}: resumed from byte {fetched.resumed_from}"
        print(render.printable(line), file=sys.stderr)
    return fetched.size


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
