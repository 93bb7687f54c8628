"""The transactional outbox: events and work messages written in the transaction of their change.

Rows are relayed to the broker by the scheduler (`services/scheduler/relay.py`) with publisher
confirms, in id order; a row is deleted once the broker confirmed it, never before: the outbox
holds what waits to be published, and nothing else (migration 0032). Events are numbered as the
relay reads them: each gets its position (`seq`) in the one installation-wide sequence and a row
in the event history (`shared/store/event_log.py`), which keeps them once they are published,
both in the statement that reads the batch (`outbox_batch`).

An event's body is made by PostgreSQL, in the statement that writes it, by its type's function
(`event_body_task`, `event_body_task_decision`, `event_body_job`, `event_body_host`: migration
0052), whoever writes it: the functions here, the set-based moves of `tasks_repo`, the
schema's `end_finished_jobs`. The models of `shared/domain/messages.py` carry the fields a
producer in Python gives (validated), and read the bodies back; the body's `message_id` and
`sent_at` are PostgreSQL's (`sent_at`: the transaction's start, in UTC).
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple

from shared.domain.messages import (
    FreezeTask,
    HostEvent,
    JobEvent,
    KillTask,
    RemoveWorkdirs,
    RunStage,
    TaskDecision,
    TaskEvent,
    to_jsonable,
)
from shared.messaging.topology import event_key
from shared.store.db import Connection

ExchangeKind = Literal["events", "work"]


class OutboxRow(NamedTuple):
    """One pending message (a tuple: a batch of hundreds is made at each read)."""

    id: int
    exchange: ExchangeKind
    routing_key: str
    #: The JSON text, as PostgreSQL writes it out: published as it is (never decoded here).
    body: bytes
    created_at: datetime
    #: An event's position (in its body too); None for a work message.
    seq: int | None = None


async def add_task_event(conn: Connection, event: TaskEvent) -> None:
    """Queue `task.<state>.<job id>`. Locks: none beyond the outbox row it inserts."""
    key = event_key("task", event.state.value, event.job_id)
    await _add_event(conn, key, "event_body_task", event)


async def add_task_decision(conn: Connection, decision: TaskDecision) -> None:
    """Queue `task.<verdict>.<job id>` (recovered, resubmitted, abandoned). Locks: none
    beyond the outbox row it inserts."""
    key = event_key("task", decision.verdict, decision.job_id)
    await _add_event(conn, key, "event_body_task_decision", decision)


async def add_job_event(conn: Connection, event: JobEvent) -> None:
    """Queue `job.<outcome>.<job id>`. Locks: none beyond the outbox row it inserts."""
    key = event_key("job", event.outcome.value, event.job_id)
    await _add_event(conn, key, "event_body_job", event)


async def add_host_event(conn: Connection, event: HostEvent) -> None:
    """Queue `host.<state>.<host>` (quarantined, probing, released, removed). Locks: none beyond the
    outbox row it inserts."""
    key = event_key("host", event.state.value, event.host)
    await _add_event(conn, key, "event_body_host", event)


_Written = TaskEvent | TaskDecision | JobEvent | HostEvent
#: What an event's model holds that its writer does not give: PostgreSQL makes the id and the
#: time, the relay the position.
_NOT_GIVEN: Final[set[str]] = {"type", "message_id", "sent_at", "seq"}


async def _add_event(conn: Connection, key: str, function: str, event: _Written) -> None:
    """Queue `event` under `key`, its body made by `function` (its type's `event_body_*`) from
    the model's fields, each passed by name."""
    fields = event.model_dump(exclude=_NOT_GIVEN)
    named = ", ".join(f'"{name}" => ${i}' for i, name in enumerate(fields, start=2))
    await conn.execute(
        "INSERT INTO outbox (exchange, routing_key, body)"
        f" VALUES ('events', $1, {function}({named}))",
        key,
        *fields.values(),
    )


async def add_work(
    conn: Connection,
    routing_key: str,
    message: RunStage | KillTask | FreezeTask | RemoveWorkdirs,
) -> None:
    """Queue a work message for the work exchange under `routing_key` (a topology key).
    Locks: none beyond the outbox row it inserts."""
    await _add(conn, "work", routing_key, to_jsonable(message))


def new_task_events(job_param: str, ids_param: str, joined: str = "") -> str:
    """The statement that queues `task.new.<job id>` for each task id of the array parameter
    `ids_param`, in order: alone, or as the main statement after a CTE that inserts those tasks
    (`jobs_repo.add_tasks`: one round trip for both); `joined`, a one-row CTE of that statement
    evaluated with it (`CROSS JOIN`). `task.new` notifies only the relay (migration 0027).
    Locks: the statement takes none beyond the outbox rows it inserts."""
    cross = f" CROSS JOIN {joined}" if joined else ""
    return f"""
INSERT INTO outbox (exchange, routing_key, body)
SELECT 'events', 'task.new.' || {job_param}::text,
    event_body_task(job_id => {job_param}::text, task_id => e.id, state => 'new')
FROM unnest({ids_param}::text[]) WITH ORDINALITY AS e(id, n){cross}
ORDER BY n
"""


async def add_work_many(
    conn: Connection, messages: Sequence[tuple[str, RunStage | KillTask | FreezeTask]]
) -> None:
    """Queue many work messages (routing key, message) in one statement. Locks: none beyond
    the outbox rows it inserts."""
    await _add_many(conn, "work", [k for k, _ in messages], [to_jsonable(m) for _, m in messages])


async def _add_many(
    conn: Connection, exchange: ExchangeKind, keys: list[str], bodies: list[dict[str, Any]]
) -> None:
    if keys:
        await conn.execute(
            "INSERT INTO outbox (exchange, routing_key, body)"
            " SELECT $1, k, b FROM unnest($2::text[], $3::jsonb[]) WITH ORDINALITY AS r(k, b, n)"
            " ORDER BY n",
            exchange,
            keys,
            bodies,
        )


async def _add(conn: Connection, exchange: ExchangeKind, key: str, body: dict[str, Any]) -> None:
    await conn.execute(
        "INSERT INTO outbox (exchange, routing_key, body) VALUES ($1, $2, $3)", exchange, key, body
    )


#: The notification that wakes the scheduling round at commit (an SQL expression).
WAKE_ROUND: Final = "pg_notify('vigil_outbox', 'round')"


async def wake_round(conn: Connection) -> None:
    """Wake the scheduling round (and through it the relay) when the caller's transaction
    commits: for a move into a quiet state (`shared.domain.states.QUIET`) made outside a worker,
    whose event notifies nobody while the task may be releasable at once (e.g. `data_ready`)."""
    await conn.execute(f"SELECT {WAKE_ROUND}")


async def has_pending(conn: Connection) -> bool:
    """Whether any row waits to be published (one probe of the primary key)."""
    return bool(
        await conn.fetchval("SELECT (SELECT id FROM outbox ORDER BY id LIMIT 1) IS NOT NULL")
    )


#: The batch, its bodies as bytes (`convert_to`): published as they are, never decoded to text
#: and encoded back (the relay's own CPU a row, `bench/relay.py`).
_BATCH: Final = (
    "SELECT id, exchange, routing_key, convert_to(body, 'UTF8'), created_at, seq"
    " FROM outbox_batch($1, $2::bigint[])"
)


async def pending(
    conn: Connection, limit: int, *, confirmed: Sequence[int] = ()
) -> list[OutboxRow]:
    """The oldest work messages and the oldest events waiting to be published, up to
    `limit` of each, in outbox order (a backlog of events, say the `task.new` of a job of
    100,000 tasks, holds up no work message: migration 0034), in one statement that also deletes
    `confirmed` (rows the broker confirmed since the last read: the delete rides on the read,
    one round trip a batch) and numbers the events among them. Locks: the confirmed outbox
    rows (their DELETE) and the `event_positions` row `FOR UPDATE` while numbering
    (`outbox_batch`); the rows read are not locked: the one relay reads them (two relays for
    a moment may publish a row twice, never number an event twice)."""
    rows = await conn.fetch(_BATCH, limit, list(confirmed))
    return [OutboxRow(*r) for r in rows]


async def delete_confirmed(conn: Connection, ids: list[int]) -> None:
    """Forget rows the broker confirmed (what `pending` does with its `confirmed`). Locks:
    those outbox rows (their DELETE)."""
    await conn.execute("DELETE FROM outbox WHERE id = ANY($1)", ids)


async def vacuum(conn: Connection) -> None:
    """Reclaim the space of deleted rows, and tell the planner the table's true size. A queue
    table's rows all end deleted: unvacuumed, its heap and indexes grow with every row it
    ever held, and a read of the few waiting rows walks through all of them (a sequential
    scan of 800 pages at each batch, 3.4 ms a call, before autovacuum came by). Skipped if
    autovacuum is at it already (`SKIP_LOCKED`). Not in a transaction. Locks: the table's
    `SHARE UPDATE EXCLUSIVE` lock, which writers and readers do not conflict with."""
    await conn.execute("VACUUM (SKIP_LOCKED, TRUNCATE false) outbox")
