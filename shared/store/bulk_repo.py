"""The record of bulk actions (`bulk_actions`): who acted, when, on what selector, with what
result. A record is written before the first task is touched and its counts are updated in
each batch's transaction, so it always says what was committed."""

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from asyncpg import Record
from pydantic import BaseModel, ConfigDict

from shared.domain.actions import TaskAction
from shared.store.db import Connection
from shared.store.users_repo import Role, User


class BulkRecord(BaseModel):
    """One row of `bulk_actions` (also its API view). For a dry run `applied` is how many tasks
    would change. `finished_at` is None while it runs (or if it was cut off)."""

    model_config = ConfigDict(frozen=True)

    id: int
    actor: str
    role: Role
    at: datetime
    finished_at: datetime | None
    action: TaskAction
    selector: dict[str, Any]
    dry_run: bool
    matched: int
    jobs: int
    applied: int
    refused: int
    refusals: dict[str, int]

    @classmethod
    def from_record(cls, record: Any) -> "BulkRecord":
        return cls.model_validate({name: record[name] for name in cls.model_fields})


async def start(
    conn: Connection,
    actor: User,
    action: str,
    selector: Mapping[str, Any],
    *,
    dry_run: bool,
    matched: int,
    jobs: int,
) -> int:
    """Record a bulk action about to be applied (or a dry run); returns its id. Locks: none
    beyond the row it inserts, plus a key-share lock on the actor's `users` row (foreign key)."""
    record_id = await conn.fetchval(
        "INSERT INTO bulk_actions (actor_id, actor, role, action, selector, dry_run, matched,"
        " jobs) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        actor.id,
        actor.name,
        actor.role,
        action,
        dict(selector),
        dry_run,
        matched,
        jobs,
    )
    return int(record_id)


async def count(
    conn: Connection,
    record_id: int,
    applied: int,
    refusals: Mapping[str, int],
    *,
    finished: bool,
) -> None:
    """Set the running totals of record `record_id` (and its end when `finished`).
    Locks: the record's row (its UPDATE)."""
    await conn.execute(
        "UPDATE bulk_actions SET applied = $2, refused = $3, refusals = $4,"
        " finished_at = CASE WHEN $5 THEN now() END WHERE id = $1",
        record_id,
        applied,
        sum(refusals.values()),
        dict(refusals),
        finished,
    )


async def get(conn: Connection, record_id: int) -> BulkRecord | None:
    """Record `record_id`, or None."""
    row = await conn.fetchrow("SELECT * FROM bulk_actions WHERE id = $1", record_id)
    return BulkRecord.from_record(row) if row else None


async def latest(
    conn: Connection, actor_id: str | None, limit: int, before: int | None = None
) -> list[BulkRecord]:
    """Newest first, at most `limit`, with ids below `before` if given; only `actor_id`'s
    unless it is None (an operator sees everyone's)."""
    rows = await conn.fetch(
        "SELECT * FROM bulk_actions WHERE ($1::text IS NULL OR actor_id = $1)"
        " AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        actor_id,
        before,
        limit,
    )
    return [BulkRecord.from_record(r) for r in rows]


# The row locks a bulk action takes before it changes a batch, or a task alone, in the
# caller's transaction: jobs first, then tasks, each in id order (the order of every writer
# of several rows).


async def lock_jobs(conn: Connection, job_ids: Sequence[str]) -> list[Record]:
    """`id`, `state` and `purged` of `job_ids`, their rows locked in id order (`FOR UPDATE`)."""
    return list(
        await conn.fetch(
            "SELECT id, state::text AS state, purged_at IS NOT NULL AS purged FROM jobs"
            " WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE",
            sorted(job_ids),
        )
    )


async def lock_tasks(conn: Connection, task_ids: Sequence[str]) -> list[Record]:
    """`id`, `state`, `test` and `superseded_by` of `task_ids`, their rows locked in id order
    (`FOR UPDATE`)."""
    return list(
        await conn.fetch(
            "SELECT id, state::text AS state, test, superseded_by FROM tasks"
            " WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE",
            sorted(task_ids),
        )
    )


async def lock_job(conn: Connection, job_id: str) -> Record | None:
    """`state` and `purged` of the job, its row locked (`FOR UPDATE`)."""
    return await conn.fetchrow(
        "SELECT state::text AS state, purged_at IS NOT NULL AS purged FROM jobs WHERE id = $1"
        " FOR UPDATE",
        job_id,
    )


async def lock_task(conn: Connection, task_id: str) -> Record | None:
    """`state` and `superseded_by` of the task, its row locked (`FOR UPDATE`)."""
    return await conn.fetchrow(
        "SELECT state::text AS state, superseded_by FROM tasks WHERE id = $1 FOR UPDATE",
        task_id,
    )
