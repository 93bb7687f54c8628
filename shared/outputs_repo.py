"""Task outputs: the recorded result files that chained jobs consume (design §6)."""

from typing import Any

from shared.db import Connection
from shared.task_types.base import OutputRecord


async def save(
    conn: Connection, task_id: str, run_number: int, host: str, records: list[OutputRecord]
) -> None:
    """Find or create each record for this run (a repeated save updates it)."""
    await conn.executemany(
        "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (task_id, run_number, name)"
        " DO UPDATE SET path = EXCLUDED.path, host = EXCLUDED.host, size = EXCLUDED.size,"
        " sha256 = EXCLUDED.sha256",
        [(task_id, run_number, r.name, r.path, host, r.size, r.sha256) for r in records],
    )


async def latest(conn: Connection, task_id: str) -> dict[str, dict[str, Any]]:
    """The outputs of the task's latest run that recorded any, by name."""
    rows = await conn.fetch(
        "SELECT name, path, host, size, sha256 FROM task_outputs WHERE task_id = $1"
        " AND run_number = (SELECT max(run_number) FROM task_outputs WHERE task_id = $1)"
        " ORDER BY name",
        task_id,
    )
    return {r["name"]: dict(r) for r in rows}
