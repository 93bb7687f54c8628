"""The transactional outbox: events and work messages written in the transaction of their change.

Rows are relayed to the broker by the scheduler (`services/scheduler/relay.py`) with publisher
confirms, in id order; a row is marked published only after the broker confirmed it.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.db import Connection
from shared.messages import (
    FreezeTask,
    JobEvent,
    KillTask,
    RemoveWorkdirs,
    RunStage,
    TaskDecision,
    TaskEvent,
    to_jsonable,
)
from shared.topology import event_key

ExchangeKind = Literal["events", "work"]


@dataclass(frozen=True)
class OutboxRow:
    """One pending message."""

    id: int
    exchange: ExchangeKind
    routing_key: str
    body: dict[str, Any]
    created_at: datetime


async def add_task_event(conn: Connection, event: TaskEvent) -> None:
    """Queue `task.<state>.<job id>`."""
    key = event_key("task", event.state.value, event.job_id)
    await _add(conn, "events", key, to_jsonable(event))


async def add_task_decision(conn: Connection, decision: TaskDecision) -> None:
    """Queue `task.<verdict>.<job id>` (recovered, resubmitted, abandoned)."""
    key = event_key("task", decision.verdict, decision.job_id)
    await _add(conn, "events", key, to_jsonable(decision))


async def add_job_event(conn: Connection, event: JobEvent) -> None:
    """Queue `job.<outcome>.<job id>`."""
    key = event_key("job", event.outcome.value, event.job_id)
    await _add(conn, "events", key, to_jsonable(event))


async def add_work(
    conn: Connection,
    routing_key: str,
    message: RunStage | KillTask | FreezeTask | RemoveWorkdirs,
) -> None:
    """Queue a work message for the work exchange under `routing_key` (a topology key)."""
    await _add(conn, "work", routing_key, to_jsonable(message))


async def _add(conn: Connection, exchange: ExchangeKind, key: str, body: dict[str, Any]) -> None:
    await conn.execute(
        "INSERT INTO outbox (exchange, routing_key, body) VALUES ($1, $2, $3)", exchange, key, body
    )


async def pending(conn: Connection, limit: int) -> list[OutboxRow]:
    """The oldest unpublished rows, locked for this transaction (SKIP LOCKED)."""
    rows = await conn.fetch(
        "SELECT id, exchange, routing_key, body, created_at FROM outbox"
        " WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit,
    )
    return [OutboxRow(**dict(r)) for r in rows]


async def mark_published(conn: Connection, ids: list[int]) -> None:
    """Record that the broker confirmed these rows."""
    await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1)", ids)


async def prune(conn: Connection, older_than_s: float) -> int:
    """Delete published rows older than `older_than_s`; returns how many went."""
    status = await conn.execute(
        "DELETE FROM outbox WHERE published_at IS NOT NULL"
        " AND published_at < now() - make_interval(secs => $1)",
        older_than_s,
    )
    return int(status.split()[-1])
