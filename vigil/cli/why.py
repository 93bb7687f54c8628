"""`vigil why`: why a task or a job's tasks wait: the reason the scheduler gave,
its message and its numbers."""

import typer

from vigil import pool
from vigil.cli.base import IdArg, JsonFlag, command, id_kind, print_json, session


@command()
def why(ctx: typer.Context, some_id: IdArg, as_json: JsonFlag = False) -> None:
    """Say why a task waits, or a job's tasks: the reason, its message and its numbers.

    A task: its state, and when it waits the reason. A job: its tasks per state, its priority
    and request when not the default, and how many of its tasks wait and why.

    --json: the task as `GET /tasks/{id}` gives it (`waiting_reason`), or the job as
    `GET /jobs/{id}` does (`waiting`, `counts`)."""
    kind = id_kind(some_id)
    with session(ctx).client() as client:
        found = client.task(some_id) if kind == "task" else client.job(some_id)
    if as_json:
        print_json(found)
        return
    for line in pool.why_task(found) if kind == "task" else pool.why_job(found):
        print(line)
