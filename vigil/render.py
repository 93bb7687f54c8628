"""How the command-line client shows things: rich tables and progress, plain lines for logs.

Everything that comes from the API (names, log lines, error briefs) may hold terminal control
sequences written by a job's command: it goes through `printable()` before it is shown, and
into rich only as `Text`, never as markup.
"""

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from vigil import pool, sizes
from vigil.sse import Event
from vigil.states import TASK_FAILED, done_and_total
from vigil.text import counts_text as counts_text
from vigil.text import printable as printable
from vigil.text import when as _time

#: Failed tasks listed under a job (`status`, a failed `wait`); the rest are counted.
MAX_FAILED_SHOWN: Final = 20


def cell(value: Any) -> Text:
    """A table cell that rich shows as is (no markup, no control characters)."""
    return Text("-" if value is None or value == "" else printable(value))


def log_line(line: Mapping[str, Any]) -> str:
    """`<task> <severity> <text>`: one stored output line."""
    return (
        f"{printable(line['task_id'])} {printable(line['severity']):<8} {printable(line['line'])}"
    )


def event_line(event: Event) -> str:
    """`<routing key> <body as JSON>` on one line."""
    body = json.dumps(event.body, ensure_ascii=False, sort_keys=True)
    return f"{printable(event.routing_key)} {printable(body)}"


def job_summary(job: Mapping[str, Any]) -> str:
    """`job j-1 completed: 3 completed`."""
    counts = job.get("counts", {})
    return f"job {printable(job['id'])} {printable(job['state'])}: {counts_text(counts)}"


def jobs_table(jobs: Iterable[Mapping[str, Any]]) -> Table:
    """One row per job: id, name, state, tasks at rest out of all, failed tasks, created."""
    table = Table("JOB", "NAME", "STATE", "TASKS", "FAILED", "CREATED", box=None)
    for job in jobs:
        counts = job.get("counts", {})
        done, total = done_and_total(counts)
        failed = sum(n for state, n in counts.items() if state in TASK_FAILED)
        table.add_row(
            cell(job["id"]),
            cell(job["name"]),
            cell(f"{job['state']}, purged" if job.get("purged_at") else job["state"]),
            cell(f"{done}/{total}"),
            cell(failed),
            cell(_time(job.get("created_at"))),
        )
    return table


def failing(tasks: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The failed tasks among `tasks` that are the last of their input's lineage: a task
    superseded by its resubmitted clone is history, not something wrong."""
    return [t for t in tasks if t["state"] in TASK_FAILED and not t.get("superseded_by")]


def superseded(tasks: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The tasks among `tasks` superseded by their resubmitted clone."""
    return [t for t in tasks if t.get("superseded_by")]


def job_detail(
    job: Mapping[str, Any],
    failed_tasks: Sequence[Mapping[str, Any]],
    superseded_tasks: Sequence[Mapping[str, Any]] = (),
) -> list[Any]:
    """What `status JOB` prints: the job's fields, its counts per state (the last task of
    each input), its failed tasks (`failing`), and the tasks resubmitted as a clone (history:
    each with its clone and the triage's decision)."""
    head = Table(box=None, show_header=False)
    for label, key in (("job", "id"), ("name", "name"), ("state", "state"), ("type", "type")):
        head.add_row(label, cell(job.get(key)))
    head.add_row("created", cell(_time(job.get("created_at"))))
    head.add_row("finished", cell(_time(job.get("finished_at"))))
    head.add_row("throttle", cell(_throttle(job)))
    for label, value in _job_facts(job):
        head.add_row(label, cell(value))
    counts = Table("STATE", "TASKS", box=None)
    for state, n in sorted(job.get("counts", {}).items()):
        counts.add_row(cell(state), cell(n))
    parts: list[Any] = [head, Text(""), counts]
    if failed_tasks:
        parts += [Text(""), failed_table(failed_tasks)]
    if superseded_tasks:
        parts += [Text(""), superseded_table(superseded_tasks)]
    return parts


def _job_facts(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rows of `status JOB` shown only when they say something: purged, what the pool
    holds its tasks on, its priority and request when not the default, why its tasks wait,
    tasks resubmitted."""
    facts = []
    if job.get("purged_at"):
        facts.append(("purged", _purged(job)))
    if job.get("waiting_on"):
        facts.append(("waiting on", str(job["waiting_on"])))
    if job.get("priority"):
        facts.append(("priority", str(job["priority"])))
    if not pool.is_default(job.get("resources")):
        facts.append(("resources", f"each task {pool.resources(job['resources'])}"))
    if waiting := pool.job_waiting(job):
        facts.append(("waiting", waiting))
    if job.get("superseded"):
        superseded = f"{job['superseded']} task(s), each superseded by its clone"
        facts.append(("resubmitted", superseded + " (not counted below)"))
    return facts


def failed_table(tasks: Sequence[Mapping[str, Any]]) -> Table:
    """Failed tasks with their failure class and error brief (the first `MAX_FAILED_SHOWN`)."""
    return _tasks_table(tasks, "failed tasks", {"ERROR": lambda t: t.get("error_brief")})


def superseded_table(tasks: Sequence[Mapping[str, Any]]) -> Table:
    """Tasks superseded by their resubmitted clone: the clone, and what the triage decided
    (the first `MAX_FAILED_SHOWN`)."""
    title = "resubmitted tasks (history: their clones carry their inputs on)"
    more = {"SUPERSEDED BY": lambda t: t.get("superseded_by"), "DECISION": decision_text}
    return _tasks_table(tasks, title, more)


def _tasks_table(
    tasks: Sequence[Mapping[str, Any]],
    title: str,
    more: Mapping[str, Callable[[Mapping[str, Any]], Any]],
) -> Table:
    """The first `MAX_FAILED_SHOWN` tasks: id, index, state, failure class, and the columns
    of `more` (heading: what it shows of a task)."""
    table = Table("TASK", "INDEX", "STATE", "CLASS", *more, box=None, title=title)
    for task in tasks[:MAX_FAILED_SHOWN]:
        table.add_row(
            cell(task["id"]),
            cell(task.get("index")),
            cell(task["state"]),
            cell(task.get("failure_class")),
            *(cell(shown(task)) for shown in more.values()),
        )
    if len(tasks) > MAX_FAILED_SHOWN:
        table.caption = f"and {len(tasks) - MAX_FAILED_SHOWN} more"
    return table


def decision_text(row: Mapping[str, Any]) -> str | None:
    """`resubmitted: signal: resubmitted (1/3) after 0.1s`: the triage's decision on a task's
    (or an attempt's) failure and its reason, or None."""
    decision, reason = row.get("decision"), row.get("decision_reason")
    if not decision:
        return None
    return f"{decision}: {reason}" if reason else str(decision)


def task_detail(task: Mapping[str, Any]) -> list[Any]:
    """What `status TASK` prints: the task's fields, its lineage and the triage's decision,
    and its attempts."""
    head = Table(box=None, show_header=False)
    for key in ("id", "job_id", "index", "input", "state", "run_number", "attempt", "host"):
        head.add_row(key, cell(json.dumps(task.get(key)) if key == "input" else task.get(key)))
    for key in ("failure_class", "exit_code", "signal", "error_brief", "progress"):
        if task.get(key) is not None:
            head.add_row(key, cell(task[key]))
    if task.get("resubmitted_from"):
        head.add_row("resubmitted_from", cell(task["resubmitted_from"]))
    if task.get("superseded_by"):
        head.add_row(
            "superseded_by",
            cell(f"{task['superseded_by']} (its clone carries the input on; this task is history)"),
        )
    if decision_text(task):
        head.add_row("decision", cell(decision_text(task)))
    if task.get("waiting_reason"):
        head.add_row("waiting", cell(pool.reason_text(task["waiting_reason"])))
    attempts = Table("ATTEMPT", "RUN", "STAGE", "HOST", "OUTCOME", "ERROR", "DECISION", box=None)
    for row in task.get("attempts", []):
        attempts.add_row(
            cell(row.get("attempt")),
            cell(row.get("run_number")),
            cell(row.get("stage")),
            cell(row.get("host")),
            cell(row.get("outcome")),
            cell(row.get("error_brief")),
            cell(decision_text(row)),
        )
    return [head, Text(""), attempts]


def hosts_table(hosts: Sequence[Mapping[str, Any]]) -> Table:
    """One row per host: slots, running tasks, free CPUs, memory and GPUs out of its
    capacity (and the free GPUs' ids), heartbeat ages, quarantine."""
    table = Table(
        "HOST",
        "SLOTS",
        "RUNNING",
        "CPUS FREE",
        "MEMORY FREE",
        "GPUS FREE",
        "WORKER",
        "SUPERVISOR",
        "QUARANTINE",
        box=None,
    )
    for host in hosts:
        table.add_row(
            cell(host.get("id")),
            cell(host.get("slots")),
            cell(host.get("running_tasks")),
            cell(pool.host_cpus(host)),
            cell(pool.host_memory(host)),
            cell(pool.host_gpus(host)),
            cell(_age(host.get("worker_heartbeat_age_s"))),
            cell(_age(host.get("supervisor_heartbeat_age_s"))),
            cell(_quarantine(host)),
        )
    return table


def pilots_table(pilots: Sequence[Mapping[str, Any]]) -> Table:
    """One row per pilot: its state (and the batch system's reason, or why it ended), batch
    job, host, what it asked for, and when its allocation ends."""
    table = Table("PILOT", "STATE", "BATCH JOB", "HOST", "CPUS", "WALLTIME", "ENDS", box=None)
    for pilot in pilots:
        state = pilot.get("state")
        if pilot.get("reason"):
            state = f"{state} ({pilot['reason']})"
        table.add_row(
            cell(pilot.get("id")),
            cell(state),
            cell(pilot.get("batch_job_id") or "-"),
            cell(pilot.get("host_id") or "-"),
            cell(pilot.get("cpus")),
            cell(f"{pilot.get('walltime_s')} s"),
            cell(pilot.get("ends_at") or "-"),
        )
    return table


def quota_text(user: Mapping[str, Any]) -> str:
    """`stores 1.5 GiB of 10 GiB` (`of no quota`; `(the default)` when it is not their own)."""
    stored = sizes.human_size(int(user.get("stored_bytes") or 0))
    limit = int(user.get("quota_bytes") or 0)
    text = f"stores {stored} of " + (sizes.human_size(limit) if limit else "no quota")
    return text + (" (the default)" if user.get("store_quota_bytes") is None else "")


def users_table(users: Sequence[Mapping[str, Any]]) -> Table:
    """One row per user: role, fair share, decayed usage (CPU-seconds), stored bytes of their
    quota, live tokens, creation, disabled."""
    table = Table(
        "USER", "ROLE", "SHARE", "USAGE", "STORED", "TOKENS", "CREATED", "DISABLED", box=None
    )
    for user in users:
        table.add_row(
            cell(user.get("name")),
            cell(user.get("role")),
            cell(pool.number(user.get("share"))),
            cell(pool.number(user.get("usage"))),
            cell(quota_text(user).removeprefix("stores ")),
            cell(user.get("tokens")),
            cell(_time(user.get("created_at"))),
            cell(_time(user.get("disabled_at"))),
        )
    return table


def tokens_table(tokens: Sequence[Mapping[str, Any]]) -> Table:
    """One row per token: its id (never the token), label, creation, revocation."""
    table = Table("TOKEN ID", "LABEL", "CREATED", "REVOKED", box=None)
    for token in tokens:
        table.add_row(
            cell(token.get("id")),
            cell(token.get("label")),
            cell(_time(token.get("created_at"))),
            cell(_time(token.get("revoked_at"))),
        )
    return table


def stop_summary(stop: Mapping[str, Any]) -> str:
    """What an emergency stop did."""
    return (
        f"emergency stop {stop.get('id')} in force: {stop.get('jobs_suspended')} job(s)"
        f" suspended, {stop.get('tasks_killed')} task(s) killed"
    )


def resume_summary(resumed: Mapping[str, Any]) -> str:
    """What lifting an emergency stop did."""
    stop = resumed.get("stop") or {}
    jobs, tasks = resumed.get("jobs_resumed") or [], resumed.get("tasks_recovered") or []
    return (
        f"emergency stop {stop.get('id')} lifted: {len(jobs)} job(s) resumed,"
        f" {len(tasks)} task(s) recovered"
    )


def progress(console: Console) -> Progress:
    """The bar `wait` shows on a terminal: tasks at rest out of all (none when redirected)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    )


def progress_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """`Progress.update` arguments for a view of the job."""
    done, total = done_and_total(job.get("counts", {}))
    description = f"{printable(job['id'])} {printable(job['state'])}"
    return {"completed": done, "total": max(total, 1), "description": description}


def _age(seconds: Any) -> str | None:
    return f"{seconds:.1f}s ago" if isinstance(seconds, int | float) else None


def _quarantine(host: Mapping[str, Any]) -> str:
    if host.get("draining"):
        return "draining" if host.get("running_tasks") else "drained (takes no new task)"
    if not host.get("quarantined"):
        return "no"
    reason = host.get("quarantine_reason")
    if host.get("probing_since"):
        since = _time(host.get("probing_since"))
        return f"probing since {since}, one task at a time" + (f": {reason}" if reason else "")
    until = _time(host.get("quarantined_until"))
    what = "breaker shut" if host.get("breaker") else "yes"
    return what + (f" until {until}" if until else "") + (f": {reason}" if reason else "")


def _purged(job: Mapping[str, Any]) -> str:
    by = f" by {job['purged_by']}" if job.get("purged_by") else ""
    why = f" ({job['purge_reason']})" if job.get("purge_reason") else ""
    return f"{_time(job['purged_at'])}{by}{why}: its logs, kept outputs and work dirs are gone"


def _throttle(job: Mapping[str, Any]) -> str:
    return (
        f"max_in_flight {job.get('max_in_flight')}, release_per_tick {job.get('release_per_tick')}"
    )
