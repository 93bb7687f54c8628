"""Global fixes: `fix` (a selector and an action, with a dry run) and `fixes` (the record)."""

from datetime import UTC, datetime
from typing import Annotated

import typer

from vigil import fixes
from vigil.cli.base import JsonFlag, command, out, print_json, session
from vigil.errors import Conflict

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
    with session(ctx).client() as client:
        try:
            result = client.bulk_action(action.value, chosen, dry_run=dry_run, confirm=yes)
        except Conflict as exc:
            raise Conflict(exc.status, fixes.confirm_hint(exc.message)) from None
    if as_json:
        print_json(result)
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
    with session(ctx).client() as client:
        records = list(client.bulk_actions(limit=limit))
    if as_json:
        print_json(records)
        return
    for record in records:
        print(fixes.record_line(record))
