"""What the dashboard pages show: bounded reads from PostgreSQL and pure display decisions.

Every query here is bounded by a limit and served by an index (tasks by `(job_id, index)`, logs
by `(job_id, seq)`), so a page stays fast with thousands of jobs and tasks.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from services.api import charts
from shared.domain.actions import JobAction, TaskAction, allowed_states, runs_again
from shared.domain.states import FAILED, TERMINAL, JobState, TaskState
from shared.store import activity
from shared.store.attempts_repo import Attempt
from shared.store.db import Connection
from shared.store.jobs_repo import Job
from shared.store.logs_repo import StoredLog
from shared.store.pilots_repo import Pilot
from shared.store.tasks_repo import BY_INDEX, Task

#: Tasks per page of the job page (and most rows one live refresh asks for).
TASKS_PER_PAGE: Final = 200
#: Log lines shown when the job page opens (more arrive live).
LOG_TAIL: Final = 200
#: Log lines of one run shown when the task page opens (more arrive live).
TASK_LOG_TAIL: Final = 500
#: The narrowest bar of the task page's timeline (per cent), so that a short attempt shows.
MIN_BAR: Final = 0.5
#: Failed tasks (latest first) and kept errors (first first) listed at the top of the job page.
PROBLEMS: Final = 20

_STATE_ORDER: Final = {state.value: i for i, state in enumerate(TaskState)}
_AT_REST: Final = frozenset(state.value for state in TERMINAL)
_JOB_ACTIONS: Final[dict[JobState, list[JobAction]]] = {
    JobState.CONFIGURING: [JobAction.ACTIVATE, JobAction.CANCEL],
    JobState.ACTIVE: [JobAction.SUSPEND, JobAction.CANCEL],
    JobState.SUSPENDED: [JobAction.RESUME, JobAction.CANCEL],
    JobState.COMPLETED: [JobAction.PURGE],
    JobState.FAILED: [JobAction.PURGE],
    JobState.CANCELLED: [JobAction.PURGE],
}


def ordered_counts(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Task counts in lifecycle order (the order of `TaskState`)."""
    return sorted(counts.items(), key=lambda item: _STATE_ORDER.get(item[0], len(_STATE_ORDER)))


def progress(counts: dict[str, int]) -> tuple[int, int]:
    """How far along a job is: (its tasks at rest, its tasks), from its counts."""
    done = sum(n for state, n in counts.items() if state in _AT_REST)
    return done, sum(counts.values())


def elapsed_s(job: Job, now: datetime) -> float:
    """Seconds from the job's submission to its end, or to `now` while it has not ended."""
    return max(((job.finished_at or now) - job.created_at).total_seconds(), 0.0)


def failed_count(counts: dict[str, int]) -> int:
    """How many tasks are in a failed state."""
    return sum(n for state, n in counts.items() if state in {s.value for s in FAILED})


def job_actions(job: Job) -> list[str]:
    """The job actions worth offering in the job's state (the api still has the last word)."""
    offered = list(_JOB_ACTIONS.get(job.state, []))
    if job.purged_at is not None:  # nothing is left to purge, nor to act on
        return []
    if failed_count(job.counts) and job.state is not JobState.CANCELLED:
        offered.append(JobAction.RECOVER_FAILED)
    return [a.value for a in offered]


def task_actions(state: TaskState, *, superseded: bool = False) -> list[str]:
    """The task actions that a task in `state` accepts (`shared.domain.actions`' table); a
    task `superseded` by its resubmitted clone only those that run nothing again."""
    return [
        a.value
        for a in TaskAction
        if state in allowed_states(a) and not (superseded and runs_again(a))
    ]


async def owner_names(conn: Connection, owner_ids: list[str]) -> dict[str, str]:
    """User id -> name for `owner_ids`."""
    rows = await conn.fetch(
        "SELECT id, name FROM users WHERE id = ANY($1::text[])", sorted(set(owner_ids))
    )
    return {r["id"]: r["name"] for r in rows}


async def task_rows(conn: Connection, job_id: str, task_ids: list[str]) -> list[Task]:
    """Those of `task_ids` that are tasks of the job, by index (the page's live refresh)."""
    rows = await conn.fetch(
        f"SELECT * FROM tasks WHERE job_id = $1 AND id = ANY($2::text[]) ORDER BY {BY_INDEX}",
        job_id,
        task_ids,
    )
    return [Task.from_record(r) for r in rows]


async def failed_tasks(conn: Connection, job_id: str, limit: int = PROBLEMS) -> list[Task]:
    """The job's failed tasks, latest change first, at most `limit`: the last of their
    lineage only (a task superseded by its resubmitted clone is history, not a problem)."""
    rows = await conn.fetch(
        "SELECT * FROM tasks WHERE job_id = $1 AND state = ANY($2::task_state[])"
        " AND superseded_by IS NULL ORDER BY updated_at DESC LIMIT $3",
        job_id,
        sorted(s.value for s in FAILED),
        limit,
    )
    return [Task.from_record(r) for r in rows]


async def log_tail(conn: Connection, job_id: str, limit: int = LOG_TAIL) -> list[StoredLog]:
    """The job's last `limit` log lines, in order."""
    rows = await conn.fetch(
        "SELECT seq, ts, task_id, run_number, attempt, severity, stream, line FROM logs"
        " WHERE job_id = $1 ORDER BY seq DESC LIMIT $2",
        job_id,
        limit,
    )
    return [StoredLog(**dict(r)) for r in reversed(rows)]


async def task_log_tail(
    conn: Connection, task_id: str, run_number: int, limit: int = TASK_LOG_TAIL
) -> list[StoredLog]:
    """The last `limit` lines of the task's run `run_number`, in order (`logs_task`)."""
    rows = await conn.fetch(
        "SELECT seq, ts, task_id, run_number, attempt, severity, stream, line FROM logs"
        " WHERE task_id = $1 AND run_number = $2 ORDER BY seq DESC LIMIT $3",
        task_id,
        run_number,
        limit,
    )
    return [StoredLog(**dict(r)) for r in reversed(rows)]


@dataclass(frozen=True)
class Bar:
    """One attempt on the task page's timeline: where its bar starts and how wide it is, in
    per cent of the span from the first attempt's start to the last one's end (or `now`)."""

    attempt: Attempt
    left: float
    width: float
    seconds: float | None  # how long it took; None while it runs


def timeline(attempts: list[Attempt], now: datetime) -> list[Bar]:
    """The attempts as bars on one time axis, oldest first."""
    if not attempts:
        return []
    start = min(a.started_at for a in attempts)
    span = max((max(a.ended_at or now for a in attempts) - start).total_seconds(), 1e-6)
    bars = []
    for a in sorted(attempts, key=lambda a: (a.started_at, a.attempt)):
        left = 100 * (a.started_at - start).total_seconds() / span
        width = 100 * ((a.ended_at or now) - a.started_at).total_seconds() / span
        width = min(max(width, MIN_BAR), max(100 - left, MIN_BAR))
        took = (a.ended_at - a.started_at).total_seconds() if a.ended_at else None
        bars.append(Bar(a, round(min(left, 100 - MIN_BAR), 2), round(width, 2), took))
    return bars


def last_status(attempts: list[Attempt]) -> dict[str, Any] | None:
    """The status file the latest attempt that read one recorded."""
    for a in sorted(attempts, key=lambda a: a.attempt, reverse=True):
        if a.status:
            return a.status
    return None


def short_input(value: Any, limit: int = 80) -> str:
    """A task's input as one short line of text (the template escapes it)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: The jobs page's charts cover this much time.
LAST_HOUR: Final = timedelta(hours=1)
#: Cluster attempts a job's run-time histogram reads at most.
RUN_TIMES: Final = 20_000
#: What the job page's activity chart shows, and the states each series counts.
_JOB_SERIES: Final = {
    "started": ["state:on_cpu"],
    "completed": ["state:completed"],
    "failed": sorted(f"state:{s.value}" for s in FAILED),
    "terminated": ["state:terminated"],
}


async def system_charts(conn: Connection, now: datetime) -> list[charts.Chart]:
    """The last hour of the whole system: commands started and tasks ended, failures per
    class (`activity`, a few hundred rows)."""
    start = now.replace(second=0, microsecond=0) - LAST_HOUR + timedelta(minutes=1)
    rows = await activity.since(conn, activity.SYSTEM, start)
    starts, width = charts.buckets(start, now)
    flow = charts.binned(rows, starts, width, {"started": ["started"], "ended": ["ended"]})
    failed = sorted({kind for _, kind, _ in rows if kind.startswith("failed:")})
    per_class = {kind.removeprefix("failed:"): [kind] for kind in failed}
    return [
        charts.columns(
            "flow",
            f"Commands started and tasks ended, per {_minutes(width)} (last hour)",
            starts,
            flow,
            stacked=False,
        ),
        charts.columns(
            "failures",
            f"Failures per class, per {_minutes(width)} (last hour)",
            starts,
            charts.binned(rows, starts, width, per_class),
            stacked=True,
        ),
    ]


async def job_charts(conn: Connection, job: Job, now: datetime) -> list[charts.Chart]:
    """A job over its life: the tasks that started, completed, failed or were terminated per
    time bucket, and how long its commands ran (its cluster attempts, at most `RUN_TIMES`)."""
    end = job.finished_at or now
    rows = await activity.since(conn, job.id, job.created_at - timedelta(minutes=1))
    starts, width = charts.buckets(job.created_at, end)
    took = await conn.fetch(
        "SELECT extract(epoch FROM a.ended_at - a.started_at)::float8 AS s"
        " FROM tasks t JOIN attempts a ON a.task_id = t.id"
        " WHERE t.job_id = $1 AND a.stage = 'cluster' AND a.ended_at IS NOT NULL LIMIT $2",
        job.id,
        RUN_TIMES,
    )
    return [
        charts.columns(
            "job-flow",
            f"Tasks that started, completed, failed or were terminated, per {_minutes(width)}",
            starts,
            charts.binned(rows, starts, width, _JOB_SERIES),
            stacked=False,
        ),
        charts.histogram("run-times", "How long the commands ran", [float(r["s"]) for r in took]),
    ]


#: Most live pilots the hosts page lists (as many as `GET /pilots` gives).
MAX_PILOTS: Final = 500

_LIVE_PILOTS: Final = (
    "SELECT p.*, h.id IS NOT NULL AS host_up, coalesce(p.ends_at, h.ends_at) AS ends,"
    " extract(epoch FROM coalesce(p.ends_at, h.ends_at) - now())::float8 AS left_s"
    " FROM pilots p LEFT JOIN hosts h ON h.id = p.host_id"
    " WHERE p.state <> 'ended' ORDER BY p.created_at DESC, p.id LIMIT $1"
)


@dataclass(frozen=True)
class PilotRow:
    """A live pilot as the hosts page shows it."""

    pilot: Pilot
    #: Its host has come up (a `hosts` row): a pending pilot's host id is only its name to be.
    host_up: bool
    #: When its allocation ends (the pilot's, else what its host said), and in how long
    #: (seconds, by the database's clock).
    ends_at: datetime | None
    left_s: float | None

    @property
    def left(self) -> str:
        """Its remaining walltime in words ("7 min left"); empty while unknown."""
        return walltime_left(self.left_s)


def walltime_left(seconds: float | None) -> str:
    """Remaining walltime in words: "40 s left", "7 min left", "2 h 05 min left"."""
    if seconds is None:
        return ""
    if seconds <= 0:
        return "walltime over"
    if seconds < 120:
        return f"{int(seconds)} s left"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min left"
    return f"{minutes // 60} h {minutes % 60:02d} min left"


async def live_pilots(conn: Connection) -> list[PilotRow]:
    """The pilots not ended, newest first (at most `MAX_PILOTS`), with their hosts' end: one
    query for the whole page (the partial index `pilots_live` holds just these rows)."""
    rows = await conn.fetch(_LIVE_PILOTS, MAX_PILOTS)
    return [PilotRow(Pilot.from_record(r), r["host_up"], r["ends"], r["left_s"]) for r in rows]


def pilots_by_host(pilots: list[PilotRow]) -> dict[str, PilotRow]:
    """Host id -> the live pilot that is that host (the newest, should two name it)."""
    found: dict[str, PilotRow] = {}
    for row in pilots:
        if row.host_up and row.pilot.host_id is not None:
            found.setdefault(row.pilot.host_id, row)
    return found


def _minutes(width: timedelta) -> str:
    minutes = int(width.total_seconds() // 60)
    return "minute" if minutes == 1 else f"{minutes} minutes"
