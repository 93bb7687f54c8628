"""The event history: every job and task event with its position, for replay and resume.

Positions are given by the relay as it reads a batch (`shared.store.outbox.pending`, migration
0019): numberings are serialized by the one counter row and commit in order, so a read of the events
after a position sees every one of them up to the newest numbered (never a later one while an
earlier is still to come). Log lines are not in it (`log.*` are read from the task's log).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from shared.domain.topics import Topic
from shared.store.db import Connection

#: Events removed by one statement of the retention (each a short transaction of its own).
PRUNE_BATCH: Final = 5000
#: The families that have positions (log lines have none).
NUMBERED_FAMILIES: Final = frozenset({"job", "task"})


@dataclass(frozen=True)
class LoggedEvent:
    """One event of the history: its position, routing key and JSON body (as text, with
    `seq`)."""

    seq: int
    routing_key: str
    body: str


@dataclass(frozen=True)
class Bounds:
    """What the history holds: positions up to `pruned_through` are gone (a reader asking to
    resume from before it has missed events); `last_given` is the newest position."""

    pruned_through: int
    last_given: int

    @property
    def oldest_retained(self) -> int:
        """The oldest position the history may still hold."""
        return self.pruned_through + 1

    def lost(self, after: int) -> bool:
        """Whether a reader that has seen everything through `after` missed pruned events."""
        return after < self.pruned_through


async def bounds(conn: Connection) -> Bounds:
    """The history's bounds now."""
    row = await conn.fetchrow("SELECT pruned_through, last_given FROM event_positions")
    assert row is not None  # migration 0019 inserts the one row
    return Bounds(row["pruned_through"], row["last_given"])


def numbered(topics: Sequence[Topic]) -> list[Topic]:
    """The topics whose events have positions (`job.*`, `task.*`)."""
    return [t for t in topics if t.family in NUMBERED_FAMILIES]


async def after(
    conn: Connection, position: int, topics: Sequence[Topic], limit: int
) -> list[LoggedEvent]:
    """The events after `position` matching any of `topics`, oldest first, at most `limit`.

    When every topic names a job, the read goes by the jobs' index (a user's stream, a job's
    history); otherwise along the positions (an operator's wildcard stream)."""
    wanted = numbered(topics)
    if not wanted:
        return []
    families = [t.family for t in wanted]
    words = [None if t.word == "*" else t.word for t in wanted]
    jobs = [t.job for t in wanted]
    match = (
        "EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[], $4::text[]) AS t(f, w, j)"
        " WHERE split_part(e.routing_key, '.', 1) = t.f"
        " AND (t.w IS NULL OR split_part(e.routing_key, '.', 2) = t.w)"
        " AND (t.j IS NULL OR e.job_id = t.j))"
    )
    by_job = all(j is not None for j in jobs)
    where = "e.job_id = ANY($4::text[]) AND " if by_job else ""
    rows = await conn.fetch(
        "SELECT e.seq, e.routing_key, e.body::text AS body FROM events e"
        f" WHERE {where}e.seq > $1 AND {match} ORDER BY e.seq LIMIT $5",
        position,
        families,
        words,
        jobs,
        limit,
    )
    return [LoggedEvent(r["seq"], r["routing_key"], r["body"]) for r in rows]


async def of_job(
    conn: Connection,
    job_id: str,
    *,
    order: Literal["oldest", "newest"],
    start: int | None,
    limit: int,
) -> list[LoggedEvent]:
    """One page of a job's history: oldest first after position `start`, or newest first
    before it (None: from the first, or from the newest)."""
    if order == "oldest":
        sql = (
            "SELECT seq, routing_key, body::text AS body FROM events"
            " WHERE job_id = $1 AND seq > coalesce($2, 0) ORDER BY seq LIMIT $3"
        )
    else:
        sql = (
            "SELECT seq, routing_key, body::text AS body FROM events"
            " WHERE job_id = $1 AND ($2::bigint IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3"
        )
    rows = await conn.fetch(sql, job_id, start, limit)
    return [LoggedEvent(r["seq"], r["routing_key"], r["body"]) for r in rows]


async def prune(conn: Connection, keep_s: float, *, batch: int = PRUNE_BATCH) -> int:
    """Remove those of the `batch` oldest events numbered more than `keep_s` ago, in one short
    statement (it reads `batch` rows at most: `numbered_at` grows with the position), and move
    `pruned_through` past them; returns how many went (call again while it returns `batch`).
    Locks: the events it deletes, then the one `event_positions` row (its UPDATE, if any went),
    which the relay's numbering locks too (`outbox_batch`)."""
    status = await conn.fetchval(
        "WITH gone AS ("
        "  DELETE FROM events WHERE seq IN (SELECT seq FROM"
        "    (SELECT seq, numbered_at FROM events ORDER BY seq LIMIT $2) AS oldest"
        "    WHERE numbered_at < clock_timestamp() - make_interval(secs => $1))"
        "  RETURNING seq),"
        " moved AS (UPDATE event_positions"
        "  SET pruned_through = greatest(pruned_through, (SELECT max(seq) FROM gone))"
        "  WHERE EXISTS (SELECT 1 FROM gone))"
        " SELECT count(*) FROM gone",
        keep_s,
        batch,
    )
    return int(status)
