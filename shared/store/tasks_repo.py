"""Task rows: reads, and every state change as a compare-and-set written with its outbox event.

`transition()`, `advance()` (the worker's successful moves, one statement each),
`cancel_job()` and `move_job_tasks()` (every task of a job at once) are the only functions that
change `tasks.state`.
Their guard is the source state from the transition table, optionally narrowed and fenced by
the claim token; no row back means someone else moved the task first, and nothing is written.
"""

import functools
import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import asyncpg

from shared.domain.errors import StaleState
from shared.domain.messages import JobEvent
from shared.domain.prerequisites import met_arrays, unmet_sql
from shared.domain.states import FAILED, TERMINAL, FailureClass, TaskState, sources_for
from shared.store import outbox
from shared.store.db import Connection, jsonb_row


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
    #: The GPU devices it was placed with (its own; None: it asked for none).
    gpu_ids: list[str] | None = None
    #: Handed to its host beyond the host's free capacity (the prefetch): its command waits
    #: there behind those of the tasks placed on capacity (`services/worker/ledger.py`).
    staged: bool = False

    @classmethod
    def from_record(cls, record: Any) -> "Task":
        data = dict(record)
        data["state"] = TaskState(data["state"])
        if data["failure_class"] is not None:
            data["failure_class"] = FailureClass(data["failure_class"])
        return cls(**{name: data[name] for name in _TASK_FIELDS})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Task":
        """The task from its row as `to_jsonb(tasks)` writes it (`RunStage.claimed`)."""
        row = jsonb_row(data, ("created_at", "updated_at", "not_before"))
        row["claim"] = None if row["claim"] is None else UUID(row["claim"])
        return cls.from_record(row)


#: The names of `Task`'s fields, the columns `from_record` takes (made once: a worker makes a
#: task from each move's returned row).
_TASK_FIELDS: Final = tuple(f.name for f in fields(Task))


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


def _held_by(param: str) -> str:
    """The fencing guard of a move of task `t`: its claim is the one in `param` (never true for
    None), the same test as `t.claim = param`, written so that it does not imply
    `claim IS NOT NULL`: that let the planner read the task through the partial index
    `tasks_in_flight` instead of its primary key, and from statistics taken when little was in
    flight it did, scanning that index whole with the id as a filter (a move's cost grew with
    the tasks in flight: 100 entries read a move under a W1 of 300 jobs)."""
    return f"(t.claim IS NOT DISTINCT FROM {param} AND {param} IS NOT NULL)"


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


#: A job's tasks in order: by index, and the tasks of one index (an input's lineage: a
#: resubmitted clone keeps its original's index) oldest first.
BY_INDEX: Final = "index, created_at, id"


async def list_for_job(conn: Connection, job_id: str) -> list[Task]:
    """Every task of `job_id`, by index (`BY_INDEX`)."""
    records = await conn.fetch(f"SELECT * FROM tasks WHERE job_id = $1 ORDER BY {BY_INDEX}", job_id)
    return [Task.from_record(r) for r in records]


async def page_for_job(
    conn: Connection,
    job_id: str,
    *,
    after: int | None,
    limit: int,
    states: Collection[TaskState] = (),
) -> list[Task]:
    """The tasks of `job_id` of the first `limit` indexes above `after` (None: from the
    first), by index (`BY_INDEX`), only those in `states` if any are given. An index comes
    whole: the tasks of an input's lineage share it (a resubmitted clone keeps its original's
    index), so a page may hold more than `limit` tasks, and the next page starts after its
    last index without missing one. A keyset page on `(job_id, index)`, as fast at the end of
    a job of 100,000 tasks as at its start."""
    # One range of the index: up to the last of the first `limit` indexes (an `index =
    # ANY(...)` of them probed the index once each: 4 times slower for a page of 100).
    records = await conn.fetch(
        "SELECT * FROM tasks WHERE job_id = $1 AND ($4::task_state[] IS NULL OR state = ANY($4))"
        " AND index > coalesce($2::integer, -2147483648)"
        " AND index <= (SELECT max(p.index) FROM (SELECT DISTINCT index FROM tasks"
        "   WHERE job_id = $1 AND index > coalesce($2::integer, -2147483648)"
        "   AND ($4::task_state[] IS NULL OR state = ANY($4)) ORDER BY index LIMIT $3) p)"
        f" ORDER BY {BY_INDEX}",
        job_id,
        after,
        limit,
        sorted(s.value for s in states) or None,
    )
    return [Task.from_record(r) for r in records]


def first_indexes(tasks: Sequence[Task], limit: int) -> tuple[list[Task], int | None]:
    """Of a page read with `limit + 1` indexes (`page_for_job`): the tasks of its first
    `limit` indexes, and the last of those indexes when the page had more (where the next
    page starts after), else None."""
    indexes = sorted({t.index for t in tasks})
    if len(indexes) <= limit:
        return list(tasks), None
    last = indexes[limit - 1]
    return [t for t in tasks if t.index <= last], last


async def held_by(conn: Connection, worker: str) -> list[Task]:
    """Non-terminal tasks that the worker instance `worker` holds."""
    return await _held(conn, "worker = $1", worker)


async def held_on(conn: Connection, host_id: str) -> list[Task]:
    """Non-terminal tasks that any worker instance of host `host_id` holds (its registered
    one, or one gone whose tasks are not resolved yet)."""
    return await _held(conn, "host = $1 AND worker IS NOT NULL", host_id)


async def _held(conn: Connection, whose: str, who: str) -> list[Task]:
    """Non-terminal tasks held (claimed) that match `whose` (SQL of this module, `$1` being
    `who`), by id."""
    records = await conn.fetch(
        f"SELECT * FROM tasks WHERE {whose} AND claim IS NOT NULL"
        " AND state <> ALL($2::task_state[]) ORDER BY id",
        who,
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
    twice. Locks: the task's row (`FOR UPDATE`, then its UPDATE), until the transaction ends.
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
        guard = f" AND {_held_by(f'${len(args)}')}"
    async with conn.transaction():
        # One round trip: lock the row, read the state it is leaving, move it if it may, and
        # queue its event.
        record = await conn.fetchrow(
            f"WITH moved AS (UPDATE tasks t SET {', '.join(sets)}"
            " FROM (SELECT id, state AS previous FROM tasks WHERE id = $1 FOR UPDATE) p"
            f" WHERE t.id = p.id AND t.state = ANY($2::task_state[]){guard}"
            " RETURNING t.*, p.previous), events AS ("
            " INSERT INTO outbox (exchange, routing_key, body)"
            " SELECT 'events', 'task.' || m.state || '.' || m.job_id,"
            f" {_MOVED_EVENT.format(job='m.job_id')} FROM moved m)"
            " SELECT * FROM moved",
            *args,
        )
        if record is None:
            now = await conn.fetchval("SELECT state FROM tasks WHERE id = $1", task_id)
            raise StaleState(f"task {task_id} is {now or 'missing'}, not movable to {dst}")
        task = Task.from_record(record)
        if job_event is not None:
            await outbox.add_job_event(conn, job_event)
    return task


@dataclass(frozen=True)
class CloseAttempt:
    """The attempt a successful move ends: its number, and the status file it left."""

    attempt: int
    status: dict[str, Any] | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class OpenAttempt:
    """The attempt a move begins (numbered after the task's last): a stage, on this worker.
    With `done`, the stage had nothing to do: the attempt ends with the move, its outcome the
    state the move reached, its status file `status`."""

    stage: str
    host: str
    worker: str
    pid: int | None = None
    done: bool = False
    status: dict[str, Any] | None = None
    #: The outcome of a `done` attempt when it is not where the move leads (one of its path).
    outcome: TaskState | None = None


async def lock_in_order(conn: Connection, task_ids: Sequence[str]) -> None:
    """Lock the rows of `task_ids` in id order (the order of every writer of several tasks),
    until the caller's transaction ends. Locks: those task rows."""
    await conn.execute(
        "SELECT 1 FROM tasks WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE", list(task_ids)
    )


def moved_task(record: Any) -> Task | None:
    """The task an `Advance` returned: its one row, all NULL when nothing moved."""
    return Task.from_record(record) if record is not None and record["id"] is not None else None


@dataclass(frozen=True)
class Steps:
    """One of the worker's successful moves, each option by name, as the worker asks for it
    (`Steps.of` makes it for a task under a claim: an `Advance`): from `path[0]` through every
    state of `path` to the last, with one `task.<state>` event per state passed, setting
    `changes`, closing the attempt `close` (its outcome: `path[1]`, where its stage led) and
    opening `open_`, numbered `task.attempt + 1`. `first` (`done`) is an attempt opened and
    ended by the move before `open_`: a stage the worker did before its task was durably its
    own (`services/worker/tenure.py`, the promised take), numbered `task.attempt + 1`, `open_`
    then `+ 2`. Guarded, if asked, by the job not being suspended (`unless_suspended`) and no
    prerequisite of stage `unless_waits` being unmet."""

    path: Sequence[TaskState]
    changes: dict[str, Any] | None = None
    close: CloseAttempt | None = None
    open_: OpenAttempt | None = None
    unless_suspended: bool = False
    unless_waits: str | None = None
    first: OpenAttempt | None = None

    def of(self, task: Task, claim: UUID) -> "Advance":
        """This move of `task`, held by `claim`."""
        return Advance(
            **{f.name: getattr(self, f.name) for f in fields(Steps)}, task=task, claim=claim
        )


@dataclass(frozen=True)
class Advance(Steps):
    """The `Steps` of `task` held by `claim`, made in one statement (one round trip, one commit
    when the caller is not in a transaction).

    The guard is the claim and the exact source state (a compare-and-set, like
    `transition()`), plus the move's own (`unless_suspended`, `unless_waits`). None when the
    guard does not match: nothing is written, and the caller finds out why on its slower path.
    Locks the task row, then the attempt rows (the order of every writer of both).

    The events are made by the statement from the row it moved (what the claim held, with
    the move's changes), one for each step of `path` (`left`, `entered`): written only if the
    row moved.

    The statement returns exactly one row (all NULL when nothing moved: `moved_task`), so that
    moves of the same shape (the same query text) can be sent together, pipelined, with
    `Connection.fetchmany` (`shared/store/transition_writer.py`).
    """

    task: Task = field(kw_only=True)
    claim: UUID = field(kw_only=True)

    def statement(self) -> tuple[str, list[Any]]:
        """(query, arguments): moves of the same shape share the query text."""
        _check_path(tuple(self.path))
        changes = {"decided": True} | (self.changes or {})
        unknown = set(changes) - SETTABLE
        if unknown:
            raise ValueError(f"cannot set {sorted(unknown)} in a transition")
        opens = [a for a in (self.first, self.open_) if a is not None]
        values: dict[str, Any] = {
            "id": self.task.id,
            "from": self.path[0].value,
            "to": self.path[-1].value,
            "claim": self.claim,
            "opens": len(opens),
            "left": [state.value for state in self.path[:-1]],
            "entered": [state.value for state in self.path[1:]],
        }
        for name, value in changes.items():
            values[f"set.{name}"] = value.value if isinstance(value, FailureClass) else value
        if self.unless_waits is not None:
            values.update((f"met{i}", met) for i, met in enumerate(met_arrays()))
        if self.close is not None:  # its outcome: the state the task reached on leaving the stage
            values |= {
                "close.attempt": self.close.attempt,
                "close.status": self.close.status,
                "close.exit_code": self.close.exit_code,
                "close.outcome": self.path[1].value,
            }
        for i, opening in enumerate(opens):
            outcome = (opening.outcome or self.path[-1]).value
            values |= {f"open{i}.{name}": getattr(opening, name) for name in _OPEN_PARAMS}
            values[f"open{i}.outcome"] = outcome  # the state it ended in, if it did
        query, names = _advance_query(
            tuple(changes),
            self.unless_suspended,
            self.unless_waits,
            self.close is not None,
            len(opens),
        )
        return query, [values[name] for name in names]

    async def apply(self, conn: Connection) -> Task | None:
        """Make the move; the task as it is now, or None when its guard did not match."""
        query, args = self.statement()
        return moved_task(await conn.fetchrow(query, *args))

    async def again(self, conn: Connection) -> Task | None:
        """This move once more, after a lost connection left unknown whether it landed: the
        task as it is if it did (its guard misses, and the task is where the move leads, under
        the claim the move leaves), else as `apply`."""
        moved = await self.apply(conn)
        if moved is not None:
            return moved
        task = await get(conn, self.task.id)
        claim = (self.changes or {}).get("claim", self.claim)
        if task is not None and task.state is self.path[-1] and task.claim == claim:
            return task
        return None


@functools.cache
def _check_path(path: tuple[TaskState, ...]) -> None:
    """Raise unless every step of `path` is one the state table allows (once per path)."""
    for previous, state in itertools.pairwise(path):
        sources_for(state, frozenset({previous}))


class _Params:
    """A statement's parameters by name, numbered `$1`, `$2`... in the order they are named:
    the statement's text refers to them by name (`self["to"]`), and its caller puts its
    arguments in that order by name, so no number is written by hand."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, *names: str) -> None:
        self.names.extend(names)

    def __getitem__(self, name: str) -> str:
        return f"${self.names.index(name) + 1}"


#: The parameters of every move, in order (`Advance.statement` gives each its value).
_MOVE_PARAMS: Final = ("id", "from", "to", "claim", "opens", "left", "entered")
#: Those of the attempt a move closes, and of each it opens (`open<i>.<name>`).
_CLOSE_PARAMS: Final = ("attempt", "status", "exit_code", "outcome")
_OPEN_PARAMS: Final = ("stage", "host", "worker", "pid", "done", "status", "outcome")


@functools.cache
def _advance_query(
    changed: tuple[str, ...],
    unless_suspended: bool,
    unless_waits: str | None,
    closes: bool,
    opens: int,
) -> tuple[str, tuple[str, ...]]:
    """The query text of `Advance`'s moves of one shape (made once per shape), and the names
    of its parameters in order: the seven of every move, `set.<column>` per `changed`
    column, `met<i>` (the met arrays of `unless_waits`), `close.<name>` of the attempt it
    `closes`, then `open<i>.<name>` per attempt it `opens`."""
    p = _Params()
    p.add(*_MOVE_PARAMS)
    p.add(*(f"set.{name}" for name in changed))
    if unless_waits is not None:
        p.add(*(f"met{i}" for i in range(len(met_arrays()))))
    if closes:
        p.add(*(f"close.{name}" for name in _CLOSE_PARAMS))
    for i in range(opens):
        p.add(*(f"open{i}.{name}" for name in _OPEN_PARAMS))
    sets = [f"state = {p['to']}", "updated_at = now()", f"attempt = t.attempt + {p['opens']}"]
    sets += [f"{name} = {p[f'set.{name}']}" for name in changed]
    guards = ""
    if unless_suspended:
        guards += (
            " AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = t.job_id AND j.state = 'suspended')"
        )
    if unless_waits is not None:
        first = p.names.index("met0") + 1
        guards += f" AND NOT {unmet_sql(unless_waits, 't.id', first)}"
    ctes = [
        f"moved AS (UPDATE tasks t SET {', '.join(sets)}"
        f" WHERE t.id = {p['id']} AND t.state = {p['from']} AND {_held_by(p['claim'])}{guards}"
        " RETURNING t.*)",
        "events AS (INSERT INTO outbox (exchange, routing_key, body)"  # in the path's order
        " SELECT 'events', 'task.' || e.state || '.' || m.job_id, event_body_task("
        " job_id => m.job_id, task_id => m.id, state => e.state::task_state,"
        " previous => e.previous::task_state, run_number => m.run_number, host => m.host,"
        " failure_class => m.failure_class, exit_code => m.exit_code, signal => m.signal,"
        " error_brief => m.error_brief) FROM moved m,"
        f" unnest({p['left']}::text[], {p['entered']}::text[])"
        " WITH ORDINALITY AS e(previous, state, n) ORDER BY e.n)",
    ]
    if closes:
        ctes.append(
            f"closed AS (UPDATE attempts a SET ended_at = now(), outcome = {p['close.outcome']},"
            f" status = {p['close.status']}, exit_code = {p['close.exit_code']} FROM moved"
            f" WHERE a.task_id = moved.id AND a.attempt = {p['close.attempt']}"
            " AND a.ended_at IS NULL)"
        )
    selects = []
    for i in range(opens):
        before = opens - 1 - i  # the last one opened is numbered as the task's attempt
        o = {name: p[f"open{i}.{name}"] for name in _OPEN_PARAMS}
        selects.append(
            f"SELECT id, attempt - {before}, run_number,"
            f" {o['stage']}, {o['host']}, {o['worker']}, {p['claim']}, {o['pid']}::integer,"
            f" CASE WHEN {o['done']}::boolean THEN now() END,"
            f" CASE WHEN {o['done']}::boolean THEN {o['outcome']}::text END,"
            f" {o['status']}::jsonb FROM moved"
        )
    if selects:
        ctes.append(
            "opened AS (INSERT INTO attempts (task_id, attempt, run_number, stage, host, worker,"
            " claim, pid, ended_at, outcome, status) " + " UNION ALL ".join(selects) + ")"
        )
    # exactly one row, moved or not (a LEFT JOIN from a row of no columns)
    query = f"WITH {', '.join(ctes)} SELECT m.* FROM (SELECT) AS one LEFT JOIN moved m ON true"
    return query, tuple(p.names)


#: Cancelling tasks in one statement: `{pick}` locks (or, for tasks the caller locked, reads)
#: the tasks with the state each leaves (`previous`); $3 is the brief. Moves them to
#: `terminated` as `cancelled`, closes their open attempts and queues their `task.terminated`
#: events, by job and index. Returns the processes of those that were on a CPU, read
#: from the rows as locked (`p`: the statement's snapshot may be older).
_CANCEL: Final = """
WITH p AS ({pick}), moved AS (
    UPDATE tasks t SET state = 'terminated', updated_at = now(), claim = NULL, worker = NULL,
        failure_class = 'cancelled', error_brief = $3, decided = true
    FROM p WHERE t.id = p.id AND t.state = p.previous
    RETURNING t.id, t.job_id, t.index, t.run_number, t.exit_code, t.signal, p.previous, p.pid,
        p.host, p.pid_create_time, p.claim
), closed AS (
    UPDATE attempts a SET ended_at = now(), outcome = 'terminated', failure_class = 'cancelled',
        error_brief = $3, reaped_at = NULL, detected_after_s = NULL
    FROM moved WHERE a.task_id = moved.id AND a.ended_at IS NULL
), events AS (
    INSERT INTO outbox (exchange, routing_key, body)
    SELECT 'events', 'task.terminated.' || m.job_id, event_body_task(
        job_id => m.job_id, task_id => m.id, state => 'terminated', previous => m.previous,
        run_number => m.run_number, host => m.host, failure_class => 'cancelled',
        exit_code => m.exit_code, signal => m.signal, error_brief => $3::text)
    FROM moved m ORDER BY m.job_id, m.index
)
SELECT id, job_id, pid, host, pid_create_time, claim, previous = 'on_cpu' AS on_cpu FROM moved
ORDER BY job_id, index
"""
#: `cancel_job`'s tasks: $1 the job id, $2 the states at rest. Test tasks only while the job is
#: configuring (once it is active they are a record).
_PICK_JOB_TASKS: Final = """
    SELECT t.id, t.state AS previous, t.pid, t.host, t.pid_create_time, t.claim
    FROM tasks t JOIN jobs j ON j.id = t.job_id
    WHERE t.job_id = $1 AND t.state <> ALL($2::task_state[])
      AND (NOT t.test OR j.state = 'configuring')
    ORDER BY t.id FOR UPDATE OF t"""
#: `cancel_tasks`' tasks: $1 their ids, $2 the state each was locked in.
_PICK_TASKS: Final = """
    SELECT t.id, u.previous::task_state AS previous, t.pid, t.host, t.pid_create_time, t.claim
    FROM unnest($1::text[], $2::text[]) AS u(id, previous) JOIN tasks t ON t.id = u.id"""


@dataclass(frozen=True)
class Process:
    """A task's running process, as its row names it: what a kill order needs."""

    task_id: str
    pid: int
    host: str
    create_time: float | None
    claim: UUID | None


async def cancel_job(conn: Connection, job_id: str, brief: str) -> list[Process]:
    """Terminate every task of `job_id` not at rest, as `cancelled` with `brief`, in one
    statement (a job of 100,000 tasks too); returns the processes of the tasks that were on a
    CPU (to be killed). The caller holds the job's row lock."""
    states = sorted(s.value for s in TERMINAL)
    records = await conn.fetch(_CANCEL.format(pick=_PICK_JOB_TASKS), job_id, states, brief)
    return [_process(r) for r in records if _running(r)]


async def cancel_tasks(
    conn: Connection, tasks: Sequence[tuple[str, TaskState]], brief: str
) -> tuple[list[tuple[str, str]], list[Process]]:
    """Terminate each (task id, state the caller locked it in) as `cancelled` with `brief`,
    in one statement; returns the (task id, job id) of those cancelled and the processes of
    those that were on a CPU (to be killed)."""
    for _, state in tasks:
        sources_for(TaskState.TERMINATED, frozenset({state}))  # a move the table allows
    if not tasks:
        return [], []
    records = await conn.fetch(
        _CANCEL.format(pick=_PICK_TASKS),
        [t for t, _ in tasks],
        [state.value for _, state in tasks],
        brief,
    )
    return [(r["id"], r["job_id"]) for r in records], [_process(r) for r in records if _running(r)]


def _running(record: Any) -> bool:
    return bool(record["on_cpu"]) and record["pid"] is not None and record["host"] is not None


def _process(record: Any) -> Process:
    return Process(
        record["id"], record["pid"], record["host"], record["pid_create_time"], record["claim"]
    )


#: `move_job_tasks`: $1 the job id, $2 the source states, $3 those whose target keeps the
#: failure fields; `{target}` the CASE from a source state to its target, `{keeps}` whether
#: the row's keeps them. Their events follow in index order.
_MOVE_JOB_TASKS: Final = """
WITH p AS (
    SELECT t.id, t.state AS previous
    FROM tasks t JOIN jobs j ON j.id = t.job_id
    WHERE t.job_id = $1 AND t.state = ANY($2::task_state[]) AND t.superseded_by IS NULL
      AND (NOT t.test OR j.state = 'configuring')
    ORDER BY t.id FOR UPDATE OF t
), moved AS (
    UPDATE tasks t SET state = {target}, updated_at = now(), claim = NULL, worker = NULL,
        decided = true,
        failure_class = CASE WHEN {keeps} THEN t.failure_class END,
        exit_code = CASE WHEN {keeps} THEN t.exit_code END,
        signal = CASE WHEN {keeps} THEN t.signal END,
        error_brief = CASE WHEN {keeps} THEN t.error_brief END,
        error_detail = CASE WHEN {keeps} THEN t.error_detail END
    FROM p WHERE t.id = p.id
    RETURNING t.id, t.index, t.state, t.run_number, t.host, t.failure_class, t.exit_code,
        t.signal, t.error_brief, p.previous
), events AS (
    INSERT INTO outbox (exchange, routing_key, body)
    SELECT 'events', 'task.' || m.state || '.' || $1::text, {event}
    FROM moved m ORDER BY m.index
)
SELECT count(*) FROM moved
"""

#: The body of the `task.<state>` event of a row `m` of a set-based move (`m.job_id` or the
#: job parameter, the row's new fields and `m.previous`).
_MOVED_EVENT: Final = """event_body_task(
        job_id => {job}, task_id => m.id, state => m.state, previous => m.previous,
        run_number => m.run_number, host => m.host, failure_class => m.failure_class,
        exit_code => m.exit_code, signal => m.signal, error_brief => m.error_brief)"""

#: Tasks moved each from the state the caller locked it in to its own target, with events.
_MOVE_TASKS: Final = """
WITH p AS (
    SELECT u.id, u.previous::task_state AS previous, u.target::task_state AS target, u.clear, u.n
    FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[])
        WITH ORDINALITY AS u(id, previous, target, clear, n)
), moved AS (
    UPDATE tasks t SET state = p.target, updated_at = now(), claim = NULL, worker = NULL,
        decided = true,
        failure_class = CASE WHEN p.clear THEN NULL ELSE t.failure_class END,
        exit_code = CASE WHEN p.clear THEN NULL ELSE t.exit_code END,
        signal = CASE WHEN p.clear THEN NULL ELSE t.signal END,
        error_brief = CASE WHEN p.clear THEN NULL ELSE t.error_brief END,
        error_detail = CASE WHEN p.clear THEN NULL ELSE t.error_detail END
    FROM p WHERE t.id = p.id AND t.state = p.previous
    RETURNING t.id, t.job_id, t.state, t.run_number, t.host, t.failure_class, t.exit_code,
        t.signal, t.error_brief, p.previous, p.n
), events AS (
    INSERT INTO outbox (exchange, routing_key, body)
    SELECT 'events', 'task.' || m.state || '.' || m.job_id, {event}
    FROM moved m ORDER BY m.n
)
SELECT id, job_id FROM moved ORDER BY n
"""


@dataclass(frozen=True)
class Move:
    """One task of a set-based move: from the state it was locked in, to `target`; `clear`
    empties its failure fields."""

    task_id: str
    previous: TaskState
    target: TaskState
    clear: bool


async def move_tasks(conn: Connection, moves: Sequence[Move]) -> list[tuple[str, str]]:
    """Move each task from `previous` (the caller locked its row in it) to its target,
    unclaimed and decided, with its `task.<target>` event, in one statement; returns the
    (task id, job id) of those moved, in order (a task no longer in `previous` is left)."""
    for move in moves:
        sources_for(move.target, frozenset({move.previous}))  # a move the table allows
        if move.target in FAILED:
            raise ValueError(f"a set-based move does not fail tasks ({move.target.value})")
    if not moves:
        return []
    rows = await conn.fetch(
        _MOVE_TASKS.format(event=_MOVED_EVENT.format(job="m.job_id")),
        [m.task_id for m in moves],
        [m.previous.value for m in moves],
        [m.target.value for m in moves],
        [m.clear for m in moves],
    )
    return [(r["id"], r["job_id"]) for r in rows]


async def move_job_tasks(
    conn: Connection,
    job_id: str,
    targets: Mapping[TaskState, TaskState],
    keeps_failure: frozenset[TaskState],
) -> int:
    """Move every task of `job_id` in a source state of `targets` to its target (test tasks
    only while the job is configuring; not a task superseded by its clone, which carries its
    input on), unclaimed, with its `task.<target>` event, in one statement; a target not in
    `keeps_failure` clears the failure fields (a recovery hook reads them). Returns how many
    moved. The caller holds the job's row lock and checked the table (`shared.domain.actions`)."""
    for source, dst in targets.items():
        sources_for(dst, frozenset({source}))  # every move is one the table allows
    case = (
        "CASE p.previous "
        + " ".join(f"WHEN '{s.value}' THEN '{t.value}'::task_state" for s, t in targets.items())
        + " END"
    )
    kept = [s.value for s, t in targets.items() if t in keeps_failure]
    keeps = "p.previous::text = ANY($3::text[])"
    event = _MOVED_EVENT.format(job="$1::text")
    statement = _MOVE_JOB_TASKS.format(target=case, keeps=keeps, event=event)
    moved = await conn.fetchval(statement, job_id, [s.value for s in targets], kept)
    return int(moved)


async def set_claim(
    conn: Connection, task_id: str, state: TaskState, claim: UUID, worker: str | None = None
) -> bool:
    """Claim an unclaimed task that is in `state` (no state change); False if someone else has.
    Locks: the task's row if it matches (its UPDATE)."""
    status = await conn.execute(
        "UPDATE tasks SET claim = $3, worker = $4, staged = false, updated_at = now()"
        " WHERE id = $1 AND state = $2 AND claim IS NULL",
        task_id,
        state.value,
        claim,
        worker,
    )
    return status == "UPDATE 1"


async def set_progress(conn: Connection, task_id: str, progress: int) -> None:
    """Record the last `PROGRESS:` value of a running task. Locks: the task's row (its
    UPDATE)."""
    await conn.execute("UPDATE tasks SET progress = $2 WHERE id = $1", task_id, progress)


async def waits_on_prerequisites(conn: Connection, task_id: str, stage: str) -> bool:
    """True when the task has a prerequisite at `stage` that is not met yet."""
    return bool(await conn.fetchval(f"SELECT {unmet_sql(stage, '$1')}", task_id, *met_arrays()))


# -- claims and bookkeeping without a state change ------------------------------------------
# Each takes the row lock of the task(s) it changes, held to the end of the caller's
# transaction; none changes `tasks.state`.


async def adopt(conn: Connection, task_id: str, state: TaskState, claim: UUID, worker: str) -> bool:
    """Make a task claimed for a worker (`claim`, resting in `state`) that worker's; False when
    it is not so any more, or when a worker holds it already: a message delivered again to the
    worker driving the task (its ack was lost) must not start a second run of it. Locks: the
    task's row if it matches (its UPDATE)."""
    status = await conn.execute(
        "UPDATE tasks SET worker = $4, updated_at = now() WHERE id = $1 AND state = $2"
        " AND claim = $3 AND worker IS NULL",
        task_id,
        state.value,
        claim,
        worker,
    )
    return bool(status == "UPDATE 1")


async def lock_held(conn: Connection, task_id: str, claim: UUID, worker: str) -> bool:
    """Whether `worker` holds the task under `claim`, locking its row until the caller's
    transaction ends if so (a worker's look at a task it holds before it drives it again:
    `services/worker/claims.py`, `Taker.resume`). Locks: the task's row if it matches."""
    found = await conn.fetchval(
        "SELECT 1 FROM tasks WHERE id = $1 AND claim = $2 AND worker = $3 FOR UPDATE",
        task_id,
        claim,
        worker,
    )
    return found is not None


async def give_back(
    conn: Connection, task_id: str, claim: UUID, state: TaskState | None = None
) -> None:
    """Unclaim the task (if it is still in `state`, when given) and wake the scheduling round,
    which may release it again at once: no outbox row announces this (migration 0018).
    Locks: the task's row if `claim` holds it (its UPDATE)."""
    await conn.execute(
        "WITH given AS (UPDATE tasks SET claim = NULL, worker = NULL"
        "  WHERE id = $1 AND claim = $2 AND ($3::task_state IS NULL OR state = $3) RETURNING 1)"
        f" SELECT {outbox.WAKE_ROUND} FROM given",
        task_id,
        claim,
        state.value if state else None,
    )


async def unclaim_untaken(conn: Connection, task_id: str, claim: UUID) -> bool:
    """Take back a claim no worker took (its work message was dead-lettered) so that the round
    releases the task again; False when the task moved on (another claim, or a worker has it).
    The round is woken when the caller's transaction commits. Locks: the task's row if it
    matches (its UPDATE)."""
    status = await conn.execute(
        "UPDATE tasks SET claim = NULL, updated_at = now() WHERE id = $1 AND claim = $2"
        " AND worker IS NULL",
        task_id,
        claim,
    )
    if status != "UPDATE 1":
        return False
    await outbox.wake_round(conn)
    return True


async def mark_decided(conn: Connection, task_id: str) -> None:
    """The triage has decided what follows the task's failure: it is not looked at again.
    Locks: the task's row (its UPDATE)."""
    await conn.execute("UPDATE tasks SET decided = true WHERE id = $1", task_id)


async def hold_back(conn: Connection, task_id: str, delay_s: float) -> None:
    """A resubmission's backoff: the round releases the task no sooner than `delay_s` from now.
    Locks: the task's row (its UPDATE)."""
    await conn.execute(
        "UPDATE tasks SET not_before = now() + make_interval(secs => $2) WHERE id = $1",
        task_id,
        delay_s,
    )


async def link_clone(conn: Connection, original_id: str, clone_id: str, infra_retries: int) -> None:
    """Resubmission's lineage: the clone (made `resubmitted_from` the original,
    `jobs_repo.add_clone`) has the original's infra retries and one more, and the original is
    superseded by the clone. Locks both rows."""
    await conn.execute(
        "UPDATE tasks SET infra_retries = $2 WHERE id = $1 AND resubmitted_from = $3",
        clone_id,
        infra_retries,
        original_id,
    )
    await conn.execute("UPDATE tasks SET superseded_by = $2 WHERE id = $1", original_id, clone_id)


async def latest_of_lineage(conn: Connection, task_id: str) -> Task | None:
    """The last task of `task_id`'s lineage: following `superseded_by` from it to the task
    that carries its input on now (itself when not superseded); None for no such task. One
    index probe per step of the lineage."""
    record = await conn.fetchrow(
        "WITH RECURSIVE line(id, depth) AS ("
        "  SELECT $1::text, 0"
        "  UNION ALL"
        "  SELECT t.superseded_by, line.depth + 1 FROM line JOIN tasks t ON t.id = line.id"
        "  WHERE t.superseded_by IS NOT NULL AND line.depth < 10000)"
        " SELECT t.* FROM line JOIN tasks t ON t.id = line.id ORDER BY line.depth DESC LIMIT 1",
        task_id,
    )
    return Task.from_record(record) if record else None


# Row locks of tasks, each taken before the write it protects, in the caller's transaction.


async def lock(conn: Connection, task_id: str) -> Task | None:
    """The task (None: no such task), its row locked (`FOR UPDATE`) for an action on it or its
    resubmission."""
    record = await conn.fetchrow("SELECT * FROM tasks WHERE id = $1 FOR UPDATE", task_id)
    return None if record is None else Task.from_record(record)


async def lock_on_cpu(conn: Connection) -> list[Task]:
    """Every `on_cpu` task, their rows locked in id order (`FOR UPDATE`), for the emergency
    stop to kill and fail them."""
    records = await conn.fetch("SELECT * FROM tasks WHERE state = 'on_cpu' ORDER BY id FOR UPDATE")
    return [Task.from_record(record) for record in records]


async def lock_tests_of_job(conn: Connection, job_id: str) -> list[Task]:
    """The job's test tasks, last first, their rows locked (`FOR UPDATE`), for its activation
    to cancel and discard them."""
    records = await conn.fetch(
        "SELECT * FROM tasks WHERE job_id = $1 AND test ORDER BY index DESC FOR UPDATE", job_id
    )
    return [Task.from_record(record) for record in records]


async def lock_undecided(
    conn: Connection, task_id: str, states: Sequence[str]
) -> asyncpg.Record | None:
    """The failed task still undecided in one of `states`, with its job's `job_policy` and
    `job_state`, for the triage to decide it: its row locked (`FOR UPDATE`) and its job's
    share-locked (`FOR SHARE`), both skipped when held (None then, as for a task decided
    meanwhile or no longer in `states`)."""
    return await conn.fetchrow(
        """
SELECT t.*, j.policy AS job_policy, j.state AS job_state FROM tasks t JOIN jobs j ON j.id = t.job_id
WHERE t.id = $1 AND NOT t.decided AND t.state = ANY($2::task_state[])
FOR UPDATE OF t SKIP LOCKED FOR SHARE OF j SKIP LOCKED
""",
        task_id,
        list(states),
    )
