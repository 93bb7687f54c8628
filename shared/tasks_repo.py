"""Task rows: reads, and every state change as a compare-and-set written with its outbox event.

`transition()` is the only function that changes `tasks.state`. Its guard is
`state = ANY(sources)` with the sources taken from the transition table, optionally narrowed
and fenced by the claim token; no row back means someone else moved the task first
(`StaleState`), and nothing is written.
"""

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from shared import outbox
from shared.db import Connection
from shared.errors import StaleState
from shared.messages import JobEvent, TaskEvent
from shared.states import FAILED, TERMINAL, FailureClass, TaskState, sources_for


@dataclass(frozen=True)
class Task:
    """One row of `tasks`."""

    id: str
    job_id: str
    index: int
    input: Any
    state: TaskState
    run_number: int
    attempt: int
    claim: UUID | None
    worker: str | None
    host: str | None
    pid: int | None
    pid_create_time: float | None
    workdir: str | None
    failure_class: FailureClass | None
    exit_code: int | None
    signal: int | None
    error_brief: str | None
    error_detail: str | None
    progress: int | None
    resubmitted_from: str | None
    superseded_by: str | None
    created_at: datetime
    updated_at: datetime
    app_retries: int = 0
    infra_retries: int = 0
    resume: dict[str, Any] | None = None
    decided: bool = True
    not_before: datetime | None = None
    test: bool = False  # a test run of a configuring job (negative index)

    @classmethod
    def from_record(cls, record: Any) -> "Task":
        data = dict(record)
        data["state"] = TaskState(data["state"])
        if data["failure_class"] is not None:
            data["failure_class"] = FailureClass(data["failure_class"])
        return cls(**{f.name: data[f.name] for f in fields(cls)})


#: Columns that `transition()` may set besides the state (never user text as a name).
SETTABLE: Final = frozenset(
    {
        "claim",
        "worker",
        "host",
        "pid",
        "pid_create_time",
        "workdir",
        "failure_class",
        "exit_code",
        "signal",
        "error_brief",
        "error_detail",
        "progress",
        "run_number",
        "attempt",
        "superseded_by",
        "app_retries",
        "infra_retries",
        "resume",
        "decided",
        "not_before",
    }
)

#: Pass as `claim=` to skip the fencing check (operators' and the scheduler's own moves).
ANY_CLAIM: Final = object()
#: Pass as `claim=` to require an unclaimed task.
UNCLAIMED: Final = object()

#: Fields cleared when a task leaves a failed state, so the row does not show an old error.
CLEAR_FAILURE: Final[dict[str, Any]] = {
    "failure_class": None,
    "exit_code": None,
    "signal": None,
    "error_brief": None,
    "error_detail": None,
}


async def get(conn: Connection, task_id: str) -> Task | None:
    """The task, or None."""
    record = await conn.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
    return Task.from_record(record) if record else None


async def list_for_job(conn: Connection, job_id: str) -> list[Task]:
    """Every task of `job_id`, by index."""
    records = await conn.fetch("SELECT * FROM tasks WHERE job_id = $1 ORDER BY index", job_id)
    return [Task.from_record(r) for r in records]


async def held_by(conn: Connection, worker: str) -> list[Task]:
    """Non-terminal tasks that the worker instance `worker` holds."""
    records = await conn.fetch(
        "SELECT * FROM tasks WHERE worker = $1 AND claim IS NOT NULL"
        " AND state <> ALL($2::task_state[]) ORDER BY id",
        worker,
        sorted(s.value for s in TERMINAL),
    )
    return [Task.from_record(r) for r in records]


async def transition(
    conn: Connection,
    task_id: str,
    dst: TaskState,
    *,
    among: frozenset[TaskState] | None = None,
    claim: object = ANY_CLAIM,
    changes: dict[str, Any] | None = None,
    job_event: JobEvent | None = None,
) -> Task:
    """Move `task_id` to `dst` if it is in an allowed source state (and holds `claim`).

    `among` narrows the table's sources; `changes` sets other columns (names from SETTABLE).
    Writes `task.<dst>.<job>` (and `job_event` if given) to the outbox in the caller's
    transaction. Entering a failed state marks the task undecided (`decided = false`) for the
    scheduler's triage; any other state marks it decided. Raises `StaleState` when the guard
    does not match; idempotent in that a repeated call fails the guard instead of applying
    twice.
    """
    changes = {"decided": dst not in FAILED} | (changes or {})
    unknown = set(changes) - SETTABLE
    if unknown:
        raise ValueError(f"cannot set {sorted(unknown)} in a transition")
    args: list[Any] = [task_id, [s.value for s in sources_for(dst, among)], dst.value]
    sets = ["state = $3", "updated_at = now()"]
    for name, value in changes.items():
        args.append(value.value if isinstance(value, FailureClass) else value)
        sets.append(f"{name} = ${len(args)}")
    guard = ""
    if claim is UNCLAIMED:
        guard = " AND t.claim IS NULL"
    elif claim is not ANY_CLAIM:
        args.append(claim)
        guard = f" AND t.claim = ${len(args)}"
    async with conn.transaction():
        # One round trip: lock the row, read the state it is leaving, and move it if it may.
        record = await conn.fetchrow(
            f"UPDATE tasks t SET {', '.join(sets)}"
            " FROM (SELECT id, state AS previous FROM tasks WHERE id = $1 FOR UPDATE) p"
            f" WHERE t.id = p.id AND t.state = ANY($2::task_state[]){guard}"
            " RETURNING t.*, p.previous",
            *args,
        )
        if record is None:
            now = await conn.fetchval("SELECT state FROM tasks WHERE id = $1", task_id)
            raise StaleState(f"task {task_id} is {now or 'missing'}, not movable to {dst}")
        task = Task.from_record(record)
        await outbox.add_task_event(conn, _event(task, TaskState(record["previous"])))
        if job_event is not None:
            await outbox.add_job_event(conn, job_event)
    return task


def _event(task: Task, previous: TaskState) -> TaskEvent:
    return TaskEvent(
        job_id=task.job_id,
        task_id=task.id,
        state=task.state,
        previous=previous,
        run_number=task.run_number,
        host=task.host,
        failure_class=task.failure_class,
        exit_code=task.exit_code,
        signal=task.signal,
        error_brief=task.error_brief,
    )


async def set_claim(
    conn: Connection, task_id: str, state: TaskState, claim: UUID, worker: str | None = None
) -> bool:
    """Claim an unclaimed task that is in `state` (no state change); False if someone else has."""
    status = await conn.execute(
        "UPDATE tasks SET claim = $3, worker = $4, updated_at = now()"
        " WHERE id = $1 AND state = $2 AND claim IS NULL",
        task_id,
        state.value,
        claim,
        worker,
    )
    return status == "UPDATE 1"


async def set_progress(conn: Connection, task_id: str, progress: int) -> None:
    """Record the last `PROGRESS:` value of a running task."""
    await conn.execute("UPDATE tasks SET progress = $2 WHERE id = $1", task_id, progress)
