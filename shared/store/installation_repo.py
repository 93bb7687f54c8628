"""The installation's identity (`installation`, one row made by its migration)."""

from shared.store.db import Connection


async def installation_id(conn: Connection) -> str:
    """This installation's id: the same for every service and host that share its database."""
    return str(await conn.fetchval("SELECT id FROM installation"))
