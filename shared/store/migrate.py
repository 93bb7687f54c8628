"""Apply pending schema migrations: `python -m shared.store.migrate`.

Idempotent and safe to run concurrently: a transaction-level advisory lock serialises runners,
and each numbered file under `shared/store/sql/` is applied once, in its own transaction.
"""

import asyncio
import logging
import re
import sys
from importlib import resources
from typing import Final

import asyncpg

logger = logging.getLogger(__name__)

_LOCK_KEY: Final = 0x56494731  # "VIG1": one advisory lock for all migration runners
_FILE_RE: Final = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) for every migration file, in order."""
    found = []
    for entry in resources.files("shared.store.sql").iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


def latest_version() -> int:
    """The highest migration version this code knows."""
    return max(version for version, _name, _sql in migrations())


async def migrate(dsn: str) -> list[str]:
    """Apply every pending migration to the database at `dsn`; returns the files applied.
    Locks: each file's transaction takes the migration advisory lock (`pg_advisory_xact_lock`)
    first, then whatever its SQL takes (an ALTER TABLE: its table), held until that file commits.
    """
    conn = await asyncpg.connect(dsn)
    applied = []
    try:
        for version, name, sql in migrations():
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                done = await conn.fetchval(
                    "SELECT 1 FROM schema_migrations WHERE version = $1", version
                )
                if done:
                    continue
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                )
                applied.append(name)
                logger.info("applied migration %s", name)
    finally:
        await conn.close()
    return applied


def main() -> None:
    """Entry point: migrate the database named by `VIGIL_DATABASE_URL`."""
    from shared.runtime.config import CommonSettings
    from shared.runtime.logs import configure_logging

    settings = CommonSettings()
    configure_logging("migrate", settings.log_level)
    applied = asyncio.run(migrate(settings.database_url))
    names = ", ".join(applied) or "none pending"
    sys.stdout.write(f"migrations applied: {len(applied)} ({names})\n")


if __name__ == "__main__":
    main()
