"""Users and their bearer tokens (stored as sha256 hashes, never in clear)."""

import hashlib
from dataclasses import dataclass
from typing import Literal

from shared.db import Connection
from shared.ids import new_id

Role = Literal["user", "operator"]


@dataclass(frozen=True)
class User:
    """Who a token belongs to."""

    id: str
    name: str
    role: Role

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


async def by_token(conn: Connection, token: str) -> User | None:
    """The user holding `token`, or None."""
    record = await conn.fetchrow(
        "SELECT u.id, u.name, u.role FROM tokens t JOIN users u ON u.id = t.user_id"
        " WHERE t.token_hash = $1",
        hash_token(token),
    )
    return User(record["id"], record["name"], record["role"]) if record else None


async def ensure_user(conn: Connection, name: str, role: Role, token: str) -> User:
    """Create (or keep) user `name` with `role` and make `token` one of theirs. Idempotent."""
    async with conn.transaction():
        record = await conn.fetchrow(
            "INSERT INTO users (id, name, role) VALUES ($1, $2, $3)"
            " ON CONFLICT (name) DO UPDATE SET role = EXCLUDED.role RETURNING id, name, role",
            new_id("u"),
            name,
            role,
        )
        assert record is not None  # INSERT ... ON CONFLICT DO UPDATE always returns the row
        await conn.execute(
            "INSERT INTO tokens (token_hash, user_id) VALUES ($1, $2)"
            " ON CONFLICT (token_hash) DO NOTHING",
            hash_token(token),
            record["id"],
        )
    return User(record["id"], record["name"], record["role"])
