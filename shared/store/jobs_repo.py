"""Job rows: creation with their tasks in one transaction, reads, and job state changes; every
write to `jobs` (and to `job_edits`, the record of its edits) lives here. Each UPDATE holds the
row lock of the job(s) it changes until the caller's transaction ends; writers that add work to
a job lock its row first (`FOR UPDATE`), under the emergency stop's shared lock
(`shared.operations.stop_guard`). The emergency stop's own changes of `jobs.state`, made
together with its record, live with that record (`emergency_repo`)."""

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final

import asyncpg

from shared.domain import bundle
from shared.domain.bundle import BundleFile
from shared.domain.errors import StaleState
from shared.domain.ids import new_id, new_ids
from shared.domain.messages import JobEvent, JobOutcome
from shared.domain.scheduling.model import DEFAULT_REQUEST
from shared.domain.scheduling.resources import Resources
from shared.domain.states import JobState, TaskState, job_sources_for
from shared.messaging.topology import event_key
from shared.store import bundle_repo, outbox, sql_states
from shared.store.db import Connection, jsonb_row


@dataclass(frozen=True)
class NewJob:
    """A validated submission, ready to be written."""

    name: str
    type: str
    command: str
    inputs: list[Any]
    outputs: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    prerequisites: dict[str, dict[str, str]] = field(default_factory=dict)
    inputs_from: str | None = None
    idempotency_key: str | None = None
    #: Created `configuring`: the inputs are held on the job and no task is made until
    #: `activate` (only test tasks run meanwhile).
    configuring: bool = False
    #: Throttles given at submission (None: the table's defaults).
    max_in_flight: int | None = None
    release_per_tick: int | None = None
    #: Its bundle: the files it was submitted with, path -> (bytes, executable).
    files: dict[str, tuple[bytes, bool]] = field(default_factory=dict)
    #: Its files given by reference to objects of the store (their size found by the api).
    referenced: list[BundleFile] = field(default_factory=list)
    #: Its rank among its owner's jobs, and what each of its tasks asks for.
    priority: int = 0
    request: Resources = DEFAULT_REQUEST


@dataclass(frozen=True)
class Job:
    """One row of `jobs`, with its task counts per state."""

    id: str
    owner_id: str
    name: str
    type: str
    command: str
    outputs: list[str]
    params: dict[str, Any]
    policy: dict[str, Any]
    prerequisites: dict[str, Any]
    inputs_from: str | None
    state: JobState
    max_in_flight: int
    release_per_tick: int
    created_at: datetime
    finished_at: datetime | None
    #: The inputs held while the job is configuring (None once it is active).
    inputs: list[Any] | None = None
    activated_at: datetime | None = None
    #: Its logs, kept outputs and work dirs are purged this long after it ends (None: never).
    retention_s: float | None = None
    #: When, by whom and why its data was purged (`shared.operations.harvest.purge_job`).
    purged_at: datetime | None = None
    purged_by: str | None = None
    purge_reason: str | None = None
    #: Since when it releases one task at a time (too many of its recent tasks failed).
    probing_since: datetime | None = None
    #: The files it was submitted with (`shared/domain/bundle.py`: path, size, sha256,
    #: executable), as JSON.
    files: list[dict[str, Any]] = field(default_factory=list)
    #: Its rank among its owner's jobs (higher first) and what each of its tasks
    #: asks for: CPUs in millicores, memory in MiB (0: none asked), whole GPUs.
    priority: int = 0
    req_millicpus: int = 1000
    req_memory_mb: int = 0
    req_gpus: int = 0
    #: Tasks per state, test tasks left out, and tasks superseded by their resubmitted clone
    #: too: the last task of each lineage, one per input (what is done, what is wrong).
    counts: dict[str, int] = field(default_factory=dict)
    #: Test tasks per state (those superseded by their clone left out).
    test_counts: dict[str, int] = field(default_factory=dict)
    #: Tasks (test tasks left out) superseded by their resubmitted clone: history, not work.
    superseded: int = 0

    @classmethod
    def from_record(
        cls,
        record: Any,
        counts: dict[str, int] | None = None,
        test_counts: dict[str, int] | None = None,
        superseded: int = 0,
    ) -> "Job":
        data = dict(record)
        data["state"] = JobState(data["state"])
        data["counts"] = counts or {}
        data["test_counts"] = test_counts or {}
        data["superseded"] = superseded
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Job":
        """The job from its row as `to_jsonb(jobs)` writes it (`RunStage.job`)."""
        times = ("created_at", "finished_at", "activated_at", "purged_at", "probing_since")
        return cls.from_record(jsonb_row(data, times))

    @property
    def request(self) -> Resources:
        """What each of its tasks asks for (`shared/domain/scheduling`)."""
        return Resources(self.req_millicpus, self.req_memory_mb, self.req_gpus)


#: What `Job` holds beside its row: its task counts.
_COUNTED: Final = ("counts", "test_counts", "superseded")
#: The columns of a job's row (what `Job` holds but its task counts).
COLUMNS: Final = tuple(f.name for f in fields(Job) if f.name not in _COUNTED)


#: The parameters of `create`'s INSERT that every job has ($1 to $17); throttles follow.
_FIXED: Final = 17


async def create(
    conn: Connection, owner_id: str, job: NewJob, *, wake_round: bool = True
) -> tuple[Job, bool]:
    """Write the job and one `new` task per input, with their events; returns (job, created).
    `wake_round`: as `add_tasks`.

    With an idempotency key already used by this owner, returns the existing job and False.
    Locks: none beyond the rows it inserts (new rows are invisible to others until commit),
    plus key-share locks on the owner's `users` row and any `inputs_from` job (foreign keys).
    """
    async with _atomic(conn):
        job_id = new_id("j")
        throttles = {
            name: value
            for name, value in (
                ("max_in_flight", job.max_in_flight),
                ("release_per_tick", job.release_per_tick),
            )
            if value is not None
        }
        extra_columns = "".join(f", {name}" for name in throttles)
        extra_values = "".join(f", ${_FIXED + 1 + i}" for i in range(len(throttles)))
        insert_job = (
            "INSERT INTO jobs (id, owner_id, name, type, command, outputs, params, policy,"
            " prerequisites, inputs_from, idempotency_key, state, inputs, priority,"
            f" req_millicpus, req_memory_mb, req_gpus{extra_columns})"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,"
            f" $17{extra_values})"
            " ON CONFLICT (owner_id, idempotency_key) DO NOTHING RETURNING *"
        )
        with_tasks = bool(job.inputs) and not job.configuring
        task_ids = new_ids("t", len(job.inputs)) if with_tasks else []
        if with_tasks:  # the job, its tasks and their events: one statement, one round trip
            ids, inputs = f"${_FIXED + 1 + len(throttles)}", f"${_FIXED + 2 + len(throttles)}"
            insert_job = (
                f"WITH job AS ({insert_job}), added AS ("
                + _insert_tasks(
                    "j.id", ids, inputs, start="0", step="1", test="false", from_job=True
                )
                + ")"
                + (_WAKE_ROUND if wake_round else "")
                + ", evented AS ("
                + outbox.new_task_events(
                    "$1", ids, joined="job CROSS JOIN woke" if wake_round else "job"
                )
                + ") SELECT * FROM job"
            )
        record = await conn.fetchrow(
            insert_job,
            job_id,
            owner_id,
            job.name,
            job.type,
            job.command,
            job.outputs,
            job.params,
            job.policy,
            job.prerequisites,
            job.inputs_from,
            job.idempotency_key,
            (JobState.CONFIGURING if job.configuring else JobState.ACTIVE).value,
            job.inputs if job.configuring else None,
            job.priority,
            job.request.millicpus,
            job.request.memory_mb,
            job.request.gpus,
            *throttles.values(),
            *((task_ids, job.inputs) if with_tasks else ()),
        )
        if record is not None and (job.files or job.referenced):
            listed = bundle.listed(job.files)
            contents = {path: content for path, (content, _) in job.files.items()}
            await bundle_repo.save(conn, job_id, listed, contents)
            everything = sorted([*listed, *job.referenced], key=lambda f: f.path)
            record = await conn.fetchrow(
                "UPDATE jobs SET files = $2 WHERE id = $1 RETURNING *",
                job_id,
                [f.as_json() for f in everything],
            )
        if record is None:
            existing = await conn.fetchrow(
                "SELECT * FROM jobs WHERE owner_id = $1 AND idempotency_key = $2",
                owner_id,
                job.idempotency_key,
            )
            assert existing is not None  # the conflict that hid our insert is that row
            return await _with_counts(conn, existing), False
        if not with_tasks:
            return Job.from_record(record), True
        return Job.from_record(record, {TaskState.NEW.value: len(job.inputs)}), True


def _atomic(conn: Connection) -> AbstractAsyncContextManager[object]:
    """A transaction, unless the caller's is already open (a savepoint would cost two round
    trips and undo nothing the caller's rollback would not)."""
    return nullcontext() if conn.is_in_transaction() else conn.transaction()


def _insert_tasks(
    job: str, ids: str, inputs: str, *, start: str, step: str, test: str, from_job: bool = False
) -> str:
    """The INSERT of one `new` task per input of `inputs`, a JSON array (one document: a
    `jsonb[]` would cost asyncpg an encoding per input, 0.4 s for 100,000), ids from the text
    array `ids`, indexes `start`, `start + step`...: SQL expressions (parameters, or `j.id`
    with `from_job`: the job the statement's `job` CTE inserts, if it did, `create`)."""
    source = "job j CROSS JOIN " if from_job else ""
    return (
        "INSERT INTO tasks (id, job_id, index, input, test)"
        f" SELECT t.id, {job}, {start} + {step} * (t.n - 1)::integer,"
        f" coalesce(t.input, 'null'::jsonb), {test}"
        f" FROM {source}ROWS FROM (unnest({ids}::text[]), jsonb_array_elements({inputs}::jsonb))"
        " WITH ORDINALITY AS t(id, input, n)"
    )


#: A CTE that notifies the round once, at commit (the events of new tasks notify only the
#: relay: migration 0027).
_WAKE_ROUND: Final = f", woke AS MATERIALIZED (SELECT {outbox.WAKE_ROUND})"


async def add_tasks(
    conn: Connection,
    job_id: str,
    inputs: list[Any],
    start_index: int,
    *,
    test: bool = False,
    wake_round: bool = True,
) -> list[str]:
    """Insert one `new` task per input with its `task.new` event, in one statement; returns
    the task ids. The statement also wakes the scheduler's round (a 'round' notification at
    commit) unless `wake_round` is False: the caller releases them itself (a submission).

    Indexes go up from `start_index`, or down from it for test tasks (see `next_index`).
    Locks: none beyond the task and outbox rows it inserts, plus a key-share lock on the job's
    row (the tasks' foreign key: a `FOR UPDATE SKIP LOCKED` of the job skips it meanwhile).
    """
    ids = new_ids("t", len(inputs))
    event_key("task", "new", job_id)  # the job id is a safe routing key word
    await conn.execute(
        "WITH added AS ("
        + _insert_tasks("$2", "$1", "$6", start="$3", step="$4", test="$5")
        + ")"
        + (_WAKE_ROUND if wake_round else "")
        + outbox.new_task_events("$2", "$1", joined="woke" if wake_round else ""),
        ids,
        job_id,
        start_index,
        -1 if test else 1,
        test,
        inputs,
    )
    return ids


async def add_clone(conn: Connection, job_id: str, original_id: str) -> str:
    """Insert the `new` clone of task `original_id` (of `job_id`): its input, its index (the
    input's: the lineage says which try it is), its test flag, `resubmitted_from` it; with
    its `task.new` event and a wake of the scheduler's round, in one statement. Returns the
    clone's id. Locks: none beyond the task and outbox rows it inserts, plus key-share locks
    on the job's row and the original's (the foreign keys); the caller holds the original's
    row `FOR UPDATE` (`shared.operations.lineage`)."""
    [clone_id] = new_ids("t", 1)
    event_key("task", "new", job_id)  # the job id is a safe routing key word
    await conn.execute(
        "WITH added AS (INSERT INTO tasks (id, job_id, index, input, test, resubmitted_from)"
        "  SELECT $1, o.job_id, o.index, o.input, o.test, o.id FROM tasks o"
        "  WHERE o.id = $2 AND o.job_id = $3)"
        + _WAKE_ROUND
        + outbox.new_task_events("$3", "ARRAY[$1::text]", joined="woke"),
        clone_id,
        original_id,
        job_id,
    )
    return clone_id


#: Times `append_tasks` tries again when a concurrent writer took the indexes it chose.
_APPEND_TRIES = 20
#: The key two tasks starting lineages of one job may not share an index by (migration 0036).
INDEX_KEY: Final = "tasks_job_id_index_lineage_key"


async def append_tasks(
    conn: Connection, job_id: str, inputs: list[Any], *, test: bool = False
) -> list[str]:
    """`add_tasks` after the job's last task (a test task: before its first), in a savepoint
    tried again if a concurrent writer took the same indexes first (the unique key
    `INDEX_KEY` says so). Locks: only what `add_tasks` takes (a key-share lock on the
    job's row, from the tasks' foreign key); no lock of its own: writers reach here holding
    the job row, a task row, or neither, and a lock here could only deadlock with them."""
    for tries_left in range(_APPEND_TRIES - 1, -1, -1):
        start = await next_index(conn, job_id, test=test)
        try:
            async with conn.transaction():
                return await add_tasks(conn, job_id, inputs, start, test=test)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != INDEX_KEY or not tries_left:
                raise
    raise AssertionError("unreachable")


async def next_index(conn: Connection, job_id: str, *, test: bool = False) -> int:
    """The index of the next task of `job_id`: 0, 1, 2... and for test tasks -1, -2..."""
    if test:
        sql = "SELECT least(coalesce(min(index), 0), 0) - 1 FROM tasks WHERE job_id = $1"
    else:
        sql = "SELECT greatest(coalesce(max(index), -1), -1) + 1 FROM tasks WHERE job_id = $1"
    return int(await conn.fetchval(sql, job_id))


async def is_suspended(conn: Connection, job_id: str) -> bool:
    """Whether the job is suspended now (one read of its state, no lock)."""
    state = await conn.fetchval("SELECT state::text FROM jobs WHERE id = $1", job_id)
    return bool(state == JobState.SUSPENDED.value)


async def get(conn: Connection, job_id: str, *, with_counts: bool = True) -> Job | None:
    """The job (with its task counts unless `with_counts` is False), or None."""
    record = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    if record is None:
        return None
    return await _with_counts(conn, record) if with_counts else Job.from_record(record)


async def _with_counts(conn: Connection, record: Any) -> Job:
    return Job.from_record(record, *await counts(conn, record["id"]))


async def counts(conn: Connection, job_id: str) -> tuple[dict[str, int], dict[str, int], int]:
    """Number of tasks of `job_id` per state (states with none are left out): the job's own
    tasks, and its test tasks, those superseded by their resubmitted clone left out of both;
    and how many of its own tasks were superseded so."""
    rows = await conn.fetch(
        "SELECT test, state, superseded_by IS NOT NULL AS superseded, count(*) AS n FROM tasks"
        " WHERE job_id = $1 GROUP BY 1, 2, 3",
        job_id,
    )
    own: dict[str, int] = {}
    tests: dict[str, int] = {}
    superseded = 0
    for r in rows:
        if not r["superseded"]:
            (tests if r["test"] else own)[str(r["state"])] = int(r["n"])
        elif not r["test"]:
            superseded += int(r["n"])
    return own, tests, superseded


async def list_jobs(
    conn: Connection,
    *,
    owner_id: str | None,
    state: JobState | None,
    name: str | None,
    limit: int,
    before: tuple[datetime, str] | None,
) -> list[Job]:
    """Jobs newest first, keyset-paginated by (created_at, id) strictly before `before`.

    `owner_id=None` lists everyone's (operators). Counts are not filled in here.
    """
    args: list[Any] = [owner_id, state.value if state else None, name, limit]
    cursor_sql = ""
    if before is not None:
        args += [before[0], before[1]]
        cursor_sql = " AND (created_at, id) < ($5, $6)"
    records = await conn.fetch(
        "SELECT * FROM jobs WHERE ($1::text IS NULL OR owner_id = $1)"
        " AND ($2::job_state IS NULL OR state = $2) AND ($3::text IS NULL OR name = $3)"
        f"{cursor_sql} ORDER BY created_at DESC, id DESC LIMIT $4",
        *args,
    )
    return [Job.from_record(r) for r in records]


async def transition(
    conn: Connection, job_id: str, dst: JobState, event: JobEvent | None = None
) -> Job:
    """Compare-and-set the job's state (finished_at follows), with `event` in the outbox.
    Locks: the job's row (its UPDATE), until the transaction ends."""
    async with conn.transaction():
        record = await conn.fetchrow(
            "UPDATE jobs SET state = $3::job_state, finished_at ="
            " CASE WHEN $3::job_state IN ('completed', 'failed', 'cancelled') THEN now() END"
            " WHERE id = $1 AND state = ANY($2::job_state[]) RETURNING *",
            job_id,
            [s.value for s in job_sources_for(dst)],
            dst.value,
        )
        if record is None:
            raise StaleState(f"job {job_id} cannot go to {dst} from its current state")
        if event is not None:
            await outbox.add_job_event(conn, event)
    return Job.from_record(record)


#: The unfinished tasks first (an index probe per job, `tasks_unfinished`), materialized so
#: that the planner never counts a job's tasks before it knows the job has finished: counting
#: first made every round of a big job read all its tasks (quadratic over the job's life).
#: `OFFSET 0` keeps the probe a subplan, run per job with the job's id as its index condition:
#: pulled up into an anti-join and planned from statistics taken when no job was active, it
#: scanned the whole index for each job (180 ms a sweep over 1,000 active jobs; migration 0033).
_FINISHED_COUNTS = (
    "WITH done AS MATERIALIZED (SELECT j.id FROM jobs j"
    " WHERE {which} AND NOT EXISTS (SELECT 1 FROM tasks t"
    "   WHERE t.job_id = j.id AND NOT t.test"
    f"   AND (NOT t.decided OR t.state NOT IN {sql_states.TERMINAL_LIST})"  # tasks_unfinished
    "   OFFSET 0)"
    " LIMIT $1)"
    " SELECT d.id, jsonb_object_agg(c.state, c.n) AS counts FROM done d"
    " JOIN LATERAL (SELECT state::text AS state, count(*) AS n FROM tasks t"
    "   WHERE t.job_id = d.id AND t.superseded_by IS NULL AND NOT t.test GROUP BY state) c"
    " ON true GROUP BY d.id"
)


async def finished_candidates(conn: Connection, limit: int) -> list[tuple[str, dict[str, int]]]:
    """Active jobs whose tasks are all terminal and decided (no failure awaits triage), with
    the counts per state of the tasks that decide the outcome (a task superseded by its
    resubmitted clone does not)."""
    rows = await conn.fetch(_FINISHED_COUNTS.format(which="j.state = 'active'"), limit)
    return [(r["id"], {k: int(v) for k, v in r["counts"].items()}) for r in rows]


async def end_finished(
    conn: Connection, job_ids: list[str]
) -> tuple[dict[str, JobState], set[str]]:
    """End those of `job_ids` that are active jobs whose tasks are all terminal and decided,
    each with its `job.succeeded` / `job.failed` event in the outbox: (the jobs ended with
    their final state, the jobs skipped because someone held their row: look again later).

    One statement, `end_finished_jobs` (migration 0029), in a transaction of its own: the
    rows are locked first (`FOR UPDATE SKIP LOCKED`: whoever adds work to a job locks its row
    too, and a finaliser never waits on one), then counted by a statement that sees whatever
    committed before the lock was granted, then the ended jobs move with their events.
    Locks: the job rows it ends (their UPDATE; those held by others are skipped).
    """
    rows = await conn.fetch("SELECT * FROM end_finished_jobs($1::text[])", job_ids)
    ended = {r["id"]: JobState(r["state"]) for r in rows if not r["skipped"]}
    return ended, {r["id"] for r in rows if r["skipped"]}


def outcome_event(job_id: str, state: JobState) -> JobEvent:
    """The `job.succeeded` / `job.failed` event for a job that reached `state`."""
    outcome = JobOutcome.SUCCEEDED if state is JobState.COMPLETED else JobOutcome.FAILED
    return JobEvent(job_id=job_id, outcome=outcome, brief=f"job {state.value}")


# -- fields that change outside the job's state ---------------------------------------------


async def hold_inputs(conn: Connection, job_id: str, inputs: list[Any]) -> None:
    """A configuring job keeps appended inputs until it is activated. Locks: the job's row
    (its UPDATE), which the caller holds `FOR UPDATE` already."""
    await conn.execute(
        "UPDATE jobs SET inputs = coalesce(inputs, '[]'::jsonb) || $2::jsonb WHERE id = $1",
        job_id,
        inputs,
    )


async def mark_activated(conn: Connection, job_id: str) -> None:
    """The job left configuring: its held inputs are tasks now, and when is recorded.
    Locks: the job's row (its UPDATE)."""
    await conn.execute("UPDATE jobs SET inputs = NULL, activated_at = now() WHERE id = $1", job_id)


async def throttle(
    conn: Connection, job_id: str, max_in_flight: int | None, release_per_tick: int | None
) -> None:
    """Change the job's throttles (None: the one it has stays). Locks: the job's row (its
    UPDATE)."""
    await conn.execute(
        "UPDATE jobs SET max_in_flight = coalesce($2, max_in_flight),"
        " release_per_tick = coalesce($3, release_per_tick) WHERE id = $1",
        job_id,
        max_in_flight,
        release_per_tick,
    )


async def edit(
    conn: Connection,
    job_id: str,
    values: dict[str, Any],
    actor: str,
    state: JobState,
    changes: dict[str, Any],
) -> None:
    """Set the job's columns `values` (their names from `shared.operations.job_edits.FIELDS`,
    checked by the caller: never user text) and record the edit (`job_edits`: who, in which
    state, what changed). Locks: the job's row (its UPDATE), which the caller holds
    `FOR UPDATE` already; the `job_edits` row is new."""
    columns = sorted(values)
    assignments = ", ".join(f"{c} = ${i}" for i, c in enumerate(columns, start=2))
    await conn.execute(
        f"UPDATE jobs SET {assignments} WHERE id = $1", job_id, *(values[c] for c in columns)
    )
    await conn.execute(
        "INSERT INTO job_edits (job_id, actor, state, changes) VALUES ($1, $2, $3, $4)",
        job_id,
        actor,
        state.value,
        changes,
    )


async def start_probing(conn: Connection, job_id: str) -> bool:
    """The job releases one task at a time from now (too many of its last tasks failed);
    False if it was probing already. Locks: the job's row if it was not probing (its
    UPDATE)."""
    return bool(
        await conn.fetchval(
            "UPDATE jobs SET probing_since = now() WHERE id = $1 AND probing_since IS NULL"
            " RETURNING id",
            job_id,
        )
    )


async def end_probing(conn: Connection) -> int:
    """Every probing job with a task completed since probing began releases fully again;
    how many. Locks: the row of each job it changes (its UPDATE, in no set order); the
    tasks are read, not locked."""
    status = await conn.execute(
        "UPDATE jobs j SET probing_since = NULL WHERE probing_since IS NOT NULL"
        " AND EXISTS (SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.state = 'completed'"
        "   AND NOT t.test"
        "   AND t.updated_at > j.probing_since)"
    )
    return int(status.split()[-1])


async def mark_purged(conn: Connection, job_id: str, actor: str, reason: str) -> None:
    """From now on nothing may bring the job back to work, and its data is to be cleared.
    Locks: the job's row (its UPDATE)."""
    await conn.execute(
        "UPDATE jobs SET purged_at = now(), purged_by = $2, purge_reason = $3,"
        " purge_done_at = NULL WHERE id = $1",
        job_id,
        actor,
        reason,
    )


async def mark_purge_done(conn: Connection, job_id: str) -> None:
    """The purged job's data is cleared. Locks: the job's row (its UPDATE)."""
    await conn.execute("UPDATE jobs SET purge_done_at = now() WHERE id = $1", job_id)


async def set_retention(conn: Connection, job_id: str, retention_s: float | None) -> None:
    """Keep the job's data `retention_s` seconds after it ends (None: forever). Locks: the
    job's row (its UPDATE)."""
    await conn.execute("UPDATE jobs SET retention_s = $2 WHERE id = $1", job_id, retention_s)


# Row locks of a job, each taken before the write it protects, in the caller's transaction
# (held until it ends; under the emergency stop's shared lock where work may be added).


async def lock_state(conn: Connection, job_id: str) -> str | None:
    """The job's state (None: no such job), its row locked (`FOR UPDATE`) for a change of the
    job or of its set of tasks: an append of inputs, a reopen, a job action, an edit."""
    state = await conn.fetchval("SELECT state FROM jobs WHERE id = $1 FOR UPDATE", job_id)
    return None if state is None else str(state)


async def lock(conn: Connection, job_id: str) -> asyncpg.Record | None:
    """The job's row (None: no such job), locked (`FOR UPDATE`) before an edit or an
    activation is validated against it: two of them never act on the same old row."""
    return await conn.fetchrow("SELECT * FROM jobs WHERE id = $1 FOR UPDATE", job_id)


async def share_lock(conn: Connection, job_id: str) -> None:
    """Share-lock the job's row (`FOR SHARE`): an append to the job (`lock_state`, `FOR
    UPDATE`) either committed before or waits until the caller's transaction ends."""
    await conn.execute("SELECT 1 FROM jobs WHERE id = $1 FOR SHARE", job_id)


async def lock_for_purge(conn: Connection, job_id: str) -> asyncpg.Record | None:
    """The job's `state`, `purged_at` and `purged_by` (None: no such job), its row locked
    (`FOR UPDATE`) while a purge is decided and marked (`mark_purged`)."""
    return await conn.fetchrow(
        "SELECT state, purged_at, purged_by FROM jobs WHERE id = $1 FOR UPDATE", job_id
    )


async def purge_mark(
    conn: Connection, job_id: str, *, share_lock: bool = False
) -> asyncpg.Record | None:
    """The job's `purged_at` and `purged_by` (None: no such job). With `share_lock` its row is
    share-locked (`FOR SHARE`) until the transaction ends: no purge (`lock_for_purge`) starts
    meanwhile."""
    lock = " FOR SHARE" if share_lock else ""
    return await conn.fetchrow(f"SELECT purged_at, purged_by FROM jobs WHERE id = $1{lock}", job_id)
