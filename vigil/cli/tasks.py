"""`vigil tasks`: a job's tasks one a line (the `squeue` / `condor_q` of a job)."""

import sys
from typing import Annotated

import typer

from vigil import task_list
from vigil.cli.base import JobArg, JsonFlag, command, expect_id, print_json, session
from vigil.errors import UsageError
from vigil.states import TASK_STATES


def wanted_states(given: list[str]) -> list[str]:
    """The states `--state` names (repeated, or as a comma list); `UsageError` for one that
    is not a task state."""
    states = sorted({s.strip() for value in given for s in value.split(",") if s.strip()})
    unknown = [s for s in states if s not in TASK_STATES]
    if unknown:
        known = ", ".join(sorted(TASK_STATES))
        raise UsageError(f"--state {', '.join(unknown)}: not a task state; one of {known}")
    return states


@command()
def tasks(
    ctx: typer.Context,
    job_id: JobArg,
    state: Annotated[
        list[str] | None,
        typer.Option(help="Only tasks in this state (repeatable, or a comma list)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the job's tasks, one a line: id, index, state, host, elapsed (in the stage that
    runs, else from start to end), progress, exit code (or signal), failure class.

    --json: the tasks as `GET /jobs/{id}/tasks` gives them (`elapsed_s`, `started_at`...)."""
    expect_id("job", job_id, "tasks")
    states = wanted_states(state or [])
    with session(ctx).client() as client:
        found = client.tasks(job_id, state=states)
    if as_json:
        print_json(found)
        return
    for line in task_list.lines(found):
        sys.stdout.write(line + "\n")
