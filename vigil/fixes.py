"""`vigil fix` and `vigil fixes`: a selector from command-line options, and how results show.

Times are given as a duration before now (`30m`, `2h`, `1d`) or as an ISO 8601 time (local
time when it has no offset); the API gets them with an offset.
"""

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from rich.table import Table

from vigil.calls import check_id
from vigil.errors import UsageError
from vigil.render import cell, printable

_DURATION_RE: Final = re.compile(r"(\d{1,9})([smhdw])")
_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: What `fix` needs at least one of.
CRITERIA_OPTIONS: Final = "--state, --class, --host, --job, --job-name, --since, --until"


class FixAction(StrEnum):
    """`fix` actions: the server's task actions."""

    RECOVER = "recover"
    RESTART_SETUP = "restart_setup"
    RESTART_CLUSTER = "restart_cluster"
    RESTART_POST_PROCESSING = "restart_post_processing"
    DUPLICATE = "duplicate"
    CANCEL = "cancel"
    HOLD = "hold"
    RELEASE = "release"


class FailureClass(StrEnum):
    """`--class` choices: the server's failure classes."""

    EXIT = "exit"
    SIGNAL = "signal"
    LOST = "lost"
    HUNG = "hung"
    WALLTIME = "walltime"
    ERROR_LOG = "error_log"
    HOOK = "hook"
    CANCELLED = "cancelled"
    HOST = "host"
    PLATFORM = "platform"
    LIMIT = "limit"
    QUOTA = "quota"
    CHECKSUM = "checksum"


def point_in_time(text: str, now: datetime) -> datetime:
    """`text` as a time: a duration before `now` (`90s`, `30m`, `2h`, `1d`, `1w`) or an ISO
    8601 time, taken as local time when it has no offset; `UsageError` otherwise."""
    match = _DURATION_RE.fullmatch(text.strip())
    try:
        if match:
            return now - timedelta(seconds=int(match[1]) * _SECONDS[match[2]])
        value = datetime.fromisoformat(text.strip())
        return value if value.tzinfo is not None else value.astimezone()
    except (ValueError, OverflowError):
        raise UsageError(
            f"{text[:100]!r} is neither a duration before now (30m, 2h, 1d) nor an ISO 8601"
            " time (2024-05-01T12:00, with an offset or taken as local time)"
        ) from None


def selector(
    *,
    states: Sequence[str] = (),
    classes: Sequence[str] = (),
    hosts: Sequence[str] = (),
    jobs: Sequence[str] = (),
    job_name: str | None = None,
    since: str | None = None,
    until: str | None = None,
    include_superseded: bool = False,
    now: datetime,
) -> dict[str, Any]:
    """The body's `selector` for the options given; `UsageError` when none names tasks."""
    found: dict[str, Any] = {
        "states": list(states),
        "failure_classes": list(classes),
        "hosts": list(hosts),
        "job_ids": [check_id("job", j) for j in jobs],
        "job_name": job_name,
        "updated_after": point_in_time(since, now).isoformat() if since else None,
        "updated_before": point_in_time(until, now).isoformat() if until else None,
    }
    chosen = {name: value for name, value in found.items() if value}
    if not chosen:
        raise UsageError(f"name the tasks to act on with at least one of {CRITERIA_OPTIONS}")
    return chosen | ({"include_superseded": True} if include_superseded else {})


def confirm_hint(message: str) -> str:
    """The API's "repeat with confirm" advice, in the command line's words."""
    return message.replace('repeat with "confirm": true', "repeat with --yes (see --dry-run)")


def summary(result: Mapping[str, Any]) -> str:
    """`fix 7 recover: 5 tasks in 2 jobs matched, 3 changed, 2 refused` (dry run: would)."""
    dry = bool(result.get("dry_run"))
    changed = "would change" if dry else "changed"
    return printable(
        f"fix {result.get('id')} {result.get('action')}{' (dry run)' if dry else ''}:"
        f" {result.get('matched')} task(s) in {result.get('jobs')} job(s) matched,"
        f" {result.get('applied')} {changed}, {result.get('refused')} refused"
    )


def refusal_lines(result: Mapping[str, Any]) -> list[str]:
    """One line per refusal reason, most frequent first: `  2 refused: <reason>`."""
    refusals: Mapping[str, int] = result.get("refusals") or {}
    ordered = sorted(refusals.items(), key=lambda kv: (-kv[1], kv[0]))
    return [printable(f"  {n} refused: {reason}") for reason, n in ordered]


def sample_table(result: Mapping[str, Any]) -> Table:
    """The matched tasks the API shows (the first by job and index), as they were selected."""
    sample: Sequence[Mapping[str, Any]] = result.get("sample") or []
    table = Table("TASK", "JOB", "INDEX", "STATE", "CLASS", "HOST", box=None)
    for task in sample:
        keys = ("id", "job_id", "index", "state", "failure_class", "host")
        table.add_row(*(cell(task.get(k)) for k in keys))
    if len(sample) < int(result.get("matched") or 0):
        table.caption = f"the first {len(sample)} of {result.get('matched')}"
    return table


def record_line(record: Mapping[str, Any]) -> str:
    """`<id> <when> <who> <action> matched N, changed N, refused N <selector JSON>`: one line
    per recorded bulk action (a selector does not fit a table column)."""
    action = str(record.get("action", "")) + (" (dry run)" if record.get("dry_run") else "")
    when = str(record.get("at", ""))[:19].replace("T", " ")
    selector = json.dumps(record.get("selector"), ensure_ascii=False, sort_keys=True)
    return printable(
        f"{record.get('id')}  {when}  {record.get('actor')}  {action}:"
        f" matched {record.get('matched')}, changed {record.get('applied')},"
        f" refused {record.get('refused')}  {selector}"
    )
