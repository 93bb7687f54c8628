"""Per-minute counts of the task events the relay published (`activity`, migration 0026).

The dashboard's charts read them: tasks that started and ended, failures per class (for the
whole system, `job_id` ''), and the tasks that reached each state (per job). The leading
scheduler counts each published event in memory (`Tally.count`) and writes the counts every few
seconds in one statement (`Tally.flush`); a write that fails keeps them for the next one. An
event published twice (at-least-once) is counted twice: these are pictures, not records.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Final

from shared.domain.states import TERMINAL, TaskState
from shared.store.db import Connection

#: The whole system's rows.
SYSTEM: Final = ""
_TERMINAL: Final = frozenset(s.value for s in TERMINAL)
_STATES: Final = frozenset(s.value for s in TaskState)
#: The states a job's chart shows (a command started, and the ends): the passing states
#: (`setting_up`, `queued`, `data_ready`...) are not counted, so that a busy system writes a
#: few rows a job and minute, not one per state.
_CHARTED: Final = frozenset({TaskState.ON_CPU.value, *_TERMINAL})

_FLUSH: Final = (
    "INSERT INTO activity (job_id, minute, kind, n)"
    " SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bigint[])"
    " ON CONFLICT (job_id, minute, kind) DO UPDATE SET n = activity.n + EXCLUDED.n"
)


def kinds(routing_key: str, body: bytes) -> list[tuple[str, str]]:
    """(job id or SYSTEM, kind) for one published event; none for what is not a task's move."""
    found, failed = _of_key(routing_key)
    if not failed:  # most ends: their bodies are not parsed
        return list(found)
    failure = json.loads(body).get("failure_class")
    return [*found, (SYSTEM, f"failed:{failure}")] if failure else list(found)


@lru_cache(maxsize=4096)
def _of_key(routing_key: str) -> tuple[tuple[tuple[str, str], ...], bool]:
    """What the key alone says (a few keys a job, each met many times: memoized), and whether
    it is an end other than `completed`, whose body may name a failure class."""
    parts = routing_key.split(".")
    if len(parts) != 3 or parts[0] != "task" or parts[1] not in _STATES:
        return (), False
    state, job_id = parts[1], parts[2]
    found = [(job_id, f"state:{state}")] if state in _CHARTED else []
    if state == TaskState.ON_CPU.value:
        found.append((SYSTEM, "started"))
    if state in _TERMINAL:
        found.append((SYSTEM, "ended"))
    return tuple(found), state in _TERMINAL and state != TaskState.COMPLETED.value


@dataclass
class Tally:
    """Counts waiting to be written: (job id, minute, kind) -> n."""

    counts: Counter[tuple[str, datetime, str]] = field(default_factory=Counter)

    def count(self, routing_key: str, body: bytes, at: datetime) -> None:
        found = kinds(routing_key, body)
        if not found:  # a passing state, most events
            return
        minute = at.replace(second=0, microsecond=0)
        for job_id, kind in found:
            self.counts[(job_id, minute, kind)] += 1

    async def flush(self, conn: Connection) -> int:
        """Write what was counted (one statement); returns how many rows it touched. On a
        failure the counts stay, to be written with the next ones.
        Locks: each `activity` row it inserts or adds to (the upsert locks a row it meets)."""
        if not self.counts:
            return 0
        taken, self.counts = self.counts, Counter()
        keys = list(taken)
        try:
            await conn.execute(
                _FLUSH,
                [k[0] for k in keys],
                [k[1] for k in keys],
                [k[2] for k in keys],
                [taken[k] for k in keys],
            )
        except BaseException:
            self.counts.update(taken)
            raise
        return len(keys)


async def since(conn: Connection, job_id: str, after: datetime) -> list[tuple[datetime, str, int]]:
    """(minute, kind, n) of `job_id` (SYSTEM: the whole system) from `after` on."""
    rows = await conn.fetch(
        "SELECT minute, kind, n FROM activity WHERE job_id = $1 AND minute >= $2"
        " ORDER BY minute, kind",
        job_id,
        after,
    )
    return [(r["minute"], r["kind"], int(r["n"])) for r in rows]


async def prune(conn: Connection, older_than_s: float) -> int:
    """Delete the minutes older than `older_than_s`; returns how many rows went.
    Locks: the `activity` rows it deletes."""
    status = await conn.execute(
        "DELETE FROM activity WHERE minute < now() - make_interval(secs => $1)", older_than_s
    )
    return int(status.split()[-1])
