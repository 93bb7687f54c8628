"""Acting on jobs and tasks: `recover`, `restart`, `cancel`, `suspend`, `resume`, `throttle`,
`priority`."""

from enum import StrEnum
from typing import Annotated

import typer

from vigil import render
from vigil.cli.base import (
    IdArg,
    JobArg,
    TaskArg,
    command,
    expect_id,
    id_kind,
    job_action,
    session,
    task_action,
)
from vigil.errors import UsageError

# -- acting on jobs and tasks -----------------------------------------------------------------


@command()
def recover(ctx: typer.Context, some_id: IdArg) -> None:
    """Recover a failed task, or every failed task of a job."""
    if id_kind(some_id) == "task":
        task_action(ctx, some_id, "recover")
    else:
        job_action(ctx, some_id, "recover_failed")


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
    """Run a completed task again from a stage (a failed one is recovered instead)."""
    task_action(ctx, expect_id("task", task_id, "restart"), f"restart_{stage.value}")


@command()
def cancel(ctx: typer.Context, some_id: IdArg) -> None:
    """Cancel a task, or a whole job."""
    if id_kind(some_id) == "task":
        task_action(ctx, some_id, "cancel")
    else:
        job_action(ctx, some_id, "cancel")


@command()
def suspend(ctx: typer.Context, job_id: JobArg) -> None:
    """Release no more tasks of the job (running ones go on)."""
    job_action(ctx, expect_id("job", job_id, "suspend"), "suspend")


@command()
def resume(ctx: typer.Context, job_id: JobArg) -> None:
    """Release the tasks of a suspended job again."""
    job_action(ctx, expect_id("job", job_id, "resume"), "resume")


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
    expect_id("job", job_id, "throttle")
    if max_in_flight is None and release_per_tick is None:
        raise UsageError("throttle needs --max-in-flight and/or --release-per-tick")
    job_action(
        ctx, job_id, "throttle", max_in_flight=max_in_flight, release_per_tick=release_per_tick
    )


@command(negative_numbers=True)
def priority(
    ctx: typer.Context,
    job_id: JobArg,
    value: Annotated[
        int, typer.Argument(metavar="N", help="Higher first; 0 by default; may be negative.")
    ],
) -> None:
    """Set the job's priority among its owner's jobs, while it has not ended.

    Priority orders one user's jobs only (fair share decides between users). A user sets
    their jobs' within the API's range (±100 by default), an operator any."""
    expect_id("job", job_id, "priority")
    with session(ctx).client() as client:
        job = client.set_priority(job_id, value)
    print(render.printable(f"job {job['id']}: priority {job.get('priority', value)}"))
