"""`shared/store/schema.sql` is the schema the migrations make: every migration applied to an
empty database, dumped with pg_dump, is the committed snapshot."""

import difflib

import pytest

from shared.store.schema_dump import COMMAND, SNAPSHOT, migrated_schema
from tests.conftest import ADMIN_DATABASE_URL, require_servers

pytestmark = pytest.mark.integration


async def test_the_snapshot_is_what_the_migrations_make() -> None:
    require_servers()
    made = await migrated_schema(ADMIN_DATABASE_URL)
    committed = SNAPSHOT.read_text()

    diff = "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            made.splitlines(keepends=True),
            "shared/store/schema.sql",
            "what the migrations make",
            n=1,
        )
    )
    assert made == committed, f"the schema snapshot is stale: run {COMMAND}\n{diff[:4000]}"
