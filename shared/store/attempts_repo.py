"""The append-only audit of attempts: one row per execution of one stage of a task."""

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from shared.domain.errors import StaleState
from shared.domain.states import FailureClass
from shared.store.db import Connection


@dataclass(frozen=True)
class Attempt:
    """One row of `attempts`."""

    id: int
    task_id: str
    attempt: int
    run_number: int
    stage: str
    host: str | None
    worker: str | None
    claim: UUID | None
    pid: int | None
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    exit_code: int | None
    signal: int | None
    failure_class: str | None
    error_brief: str | None
    error_detail: str | None
    log_path: str | None
    status: dict[str, Any] | None = None
    decision: str | None = None
    decision_reason: str | None = None
    decided_at: datetime | None = None
    late_report: dict[str, Any] | None = None
    reaped_at: datetime | None = None
    detected_after_s: float | None = None

    @classmethod
    def from_record(cls, record: Any) -> "Attempt":
        data = dict(record)
        return cls(**{f.name: data[f.name] for f in fields(cls)})


async def start(
    conn: Connection,
    task_id: str,
    claim: UUID,
    stage: str,
    *,
    host: str,
    worker: str,
    log_path: str | None = None,
) -> Attempt:
    """Open the next attempt (of a stage, or a hook by its name) of a task that `claim` holds.

    Raises `StaleState` if the claim is not the task's. Locks: the task's row (its UPDATE of
    `attempt`), then none beyond the attempt row it inserts.
    """
    numbers = await conn.fetchrow(
        "UPDATE tasks SET attempt = attempt + 1 WHERE id = $1 AND claim = $2"
        " RETURNING attempt, run_number",
        task_id,
        claim,
    )
    if numbers is None:
        raise StaleState(f"task {task_id} is no longer held by claim {claim}")
    record = await conn.fetchrow(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker, claim, log_path)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING *",
        task_id,
        numbers["attempt"],
        numbers["run_number"],
        stage,
        host,
        worker,
        claim,
        log_path,
    )
    return Attempt.from_record(record)


async def set_pid(conn: Connection, task_id: str, attempt: int, pid: int) -> None:
    """Record the pid of the attempt's process. Locks: the attempt's row (its UPDATE)."""
    await conn.execute(
        "UPDATE attempts SET pid = $3 WHERE task_id = $1 AND attempt = $2", task_id, attempt, pid
    )


async def finish(
    conn: Connection,
    task_id: str,
    attempt: int,
    outcome: str,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    failure_class: FailureClass | None = None,
    error_brief: str | None = None,
    error_detail: str | None = None,
    status: dict[str, Any] | None = None,
    detected_after_s: float | None = None,
) -> None:
    """Close an attempt with its outcome; an attempt already closed is left as it is.

    `detected_after_s`: for a failure, how long after it happened it was recorded.
    Locks: the attempt's row if still open (its UPDATE); callers lock the task row first.
    """
    await conn.execute(
        "UPDATE attempts SET ended_at = now(), outcome = $3, exit_code = $4, signal = $5,"
        " failure_class = $6, error_brief = $7, error_detail = $8, status = $9,"
        " detected_after_s = $10"
        " WHERE task_id = $1 AND attempt = $2 AND ended_at IS NULL",
        task_id,
        attempt,
        outcome,
        exit_code,
        signal,
        failure_class.value if failure_class else None,
        error_brief,
        error_detail,
        status,
        detected_after_s,
    )


async def close_open(
    conn: Connection,
    task_id: str,
    outcome: str,
    failure_class: FailureClass,
    brief: str,
    *,
    reaped: bool = False,
    detected_after_s: float | None = None,
) -> None:
    """Close every open attempt of a task (its worker or process is gone).

    `reaped`: the caller knows the attempt's process is gone (it killed it or saw it die).
    Locks: the task's open attempt rows (its UPDATE); callers hold the task row already.
    """
    await conn.execute(
        "UPDATE attempts SET ended_at = now(), outcome = $2, failure_class = $3,"
        " error_brief = $4, reaped_at = CASE WHEN $5 THEN now() END, detected_after_s = $6"
        " WHERE task_id = $1 AND ended_at IS NULL",
        task_id,
        outcome,
        failure_class.value,
        brief,
        reaped,
        detected_after_s,
    )


async def mark_reaped(conn: Connection, task_id: str, pid: int) -> None:
    """Record that the process `pid` of the task's attempt is gone (killed or found dead).
    Locks: the attempt rows of that pid not yet reaped (its UPDATE); not the task row."""
    await conn.execute(
        "UPDATE attempts SET reaped_at = now()"
        " WHERE task_id = $1 AND pid = $2 AND reaped_at IS NULL",
        task_id,
        pid,
    )


#: The failure classes an attempt is closed with by someone who is not its command's parent,
#: and who therefore does not know that the command is gone: a cancel (by hand, a job's, an
#: emergency stop's, `fail_fast`), a task declared lost (the reaper, a worker that stopped with
#: it in hand or stopped driving it), a worker's own failure while it drove the task (its
#: bookkeeping, or the database under it). Every other class of a cluster attempt is written by
#: whoever saw the command end (its worker, the parent) or killed it (the supervisor's
#: verdicts, which record `reaped_at` with it). Migration 0035's index names the same list.
KILL_OWED_CLASSES: Final = tuple(
    c.value
    for c in (
        FailureClass.CANCELLED,
        FailureClass.LOST,
        FailureClass.HOOK,
        FailureClass.HOST,
        FailureClass.PLATFORM,
    )
)


def kill_owed_on(host: str) -> str:
    """The attempts `a` of the host named by the SQL expression `host` owed a kill: the
    predicate of the partial index `attempts_kill_owed` (migration 0035), read by `kills_owed`
    and by the supervisor's beat (`hosts_repo.beat_supervisor`, and the beats the scheduler
    writes for it)."""
    return (
        f"a.host = {host} AND a.pid IS NOT NULL AND a.reaped_at IS NULL AND a.ended_at IS NOT NULL"
        " AND a.failure_class IN (" + ", ".join(f"'{c}'" for c in KILL_OWED_CLASSES) + ")"
    )


#: The attempts `a` of host `$1` owed a kill (`kill_owed_on`).
KILL_OWED_ON_HOST: Final = kill_owed_on("$1")

_KILLS_OWED: Final = f"""
SELECT a.task_id, a.claim, a.pid, a.failure_class::text AS failure_class,
       CASE WHEN t.pid = a.pid THEN t.pid_create_time END AS created
FROM attempts a JOIN tasks t ON t.id = a.task_id
WHERE {KILL_OWED_ON_HOST}
ORDER BY a.id
"""


@dataclass(frozen=True)
class OwedKill:
    """A command of this host whose attempt was closed by someone not its parent and that is
    not known gone: its task, the claim it ran under (its cgroup and `VIGIL_MARK` name it),
    its pid, its create time when the task's row still names that pid (else None), and the
    class its attempt was closed with."""

    task_id: str
    claim: UUID | None
    pid: int
    created: float | None
    failure_class: str


async def kills_owed(conn: Connection, host: str) -> list[OwedKill]:
    """The commands on `host` that nobody runs any more and nobody has seen gone: attempts
    with a pid, closed with a class of `KILL_OWED_CLASSES`, not reaped (through the partial
    index `attempts_kill_owed`, migration 0035: the few rows owed, whatever the history)."""
    records = await conn.fetch(_KILLS_OWED, host)
    return [
        OwedKill(r["task_id"], r["claim"], r["pid"], r["created"], r["failure_class"])
        for r in records
    ]


async def record_late_report(
    conn: Connection, task_id: str, attempt: int, report: dict[str, Any]
) -> None:
    """Keep a report that arrived after the attempt was fenced off (it changed nothing).
    Locks: the attempt's row (its UPDATE); not the task row."""
    await conn.execute(
        "UPDATE attempts SET late_report = $3 WHERE task_id = $1 AND attempt = $2",
        task_id,
        attempt,
        report,
    )


async def record_decision(conn: Connection, task_id: str, decision: str, reason: str) -> None:
    """Write triage's decision on the task's last attempt. Locks: that attempt's row (its
    UPDATE)."""
    await conn.execute(
        "UPDATE attempts SET decision = $2, decision_reason = $3, decided_at = now()"
        " WHERE id = (SELECT max(id) FROM attempts WHERE task_id = $1)",
        task_id,
        decision,
        reason,
    )


async def list_for_task(conn: Connection, task_id: str) -> list[Attempt]:
    """Every attempt of a task, oldest first."""
    records = await conn.fetch(
        "SELECT * FROM attempts WHERE task_id = $1 ORDER BY attempt", task_id
    )
    return [Attempt.from_record(r) for r in records]
