"""Users and their bearer tokens (stored as sha256 hashes, never in clear)."""

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from shared.domain.errors import Conflict, NotFound
from shared.domain.ids import new_id
from shared.store.db import Connection

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


def token_id(token_hash: str) -> str:
    """A token's public id, by which it is listed and revoked (migration 0016)."""
    return "k-" + token_hash[:12]


async def job_uid(conn: Connection, user_id: str) -> int:
    """The number of the Unix uid the user's jobs run as (`VIGIL_JOB_UID_BASE` + it)."""
    value = await conn.fetchval("SELECT job_uid FROM users WHERE id = $1", user_id)
    if value is None:
        raise LookupError(f"no user {user_id!r}")
    return int(value)


@dataclass(frozen=True)
class Holder:
    """Who holds a valid token, and for how long it stays valid (None: no expiry)."""

    user: User
    expires_in_s: float | None


async def holder(conn: Connection, token_hash: str) -> Holder | None:
    """The holder of the token stored as `token_hash` while it is valid (not revoked, not
    expired, its user not disabled), or None."""
    record = await conn.fetchrow(
        "SELECT u.id, u.name, u.role, extract(epoch FROM t.expires_at - now())::float8 AS left_s"
        " FROM tokens t JOIN users u ON u.id = t.user_id"
        " WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND u.disabled_at IS NULL"
        " AND (t.expires_at IS NULL OR t.expires_at > now())",
        token_hash,
    )
    if record is None:
        return None
    return Holder(User(record["id"], record["name"], record["role"]), record["left_s"])


async def by_token(conn: Connection, token: str) -> User | None:
    """The user holding `token`, or None."""
    found = await holder(conn, hash_token(token))
    return found.user if found else None


async def ensure_user(conn: Connection, name: str, role: Role, token: str) -> User:
    """Create (or keep) user `name` with `role` and make `token` one of theirs. Idempotent.
    Locks: the user's row (the upsert's insert or update), then none beyond the token row."""
    async with conn.transaction():
        record = await conn.fetchrow(
            "INSERT INTO users (id, name, role) VALUES ($1, $2, $3)"
            " ON CONFLICT (name) DO UPDATE SET role = EXCLUDED.role RETURNING id, name, role",
            new_id("u"),
            name,
            role,
        )
        assert record is not None  # INSERT ... ON CONFLICT DO UPDATE always returns the row
        hashed = hash_token(token)
        await conn.execute(
            "INSERT INTO tokens (token_hash, user_id, id, label) VALUES ($1, $2, $3, 'bootstrap')"
            " ON CONFLICT (token_hash) DO NOTHING",  # a revoked one stays revoked
            hashed,
            record["id"],
            token_id(hashed),
        )
    return User(record["id"], record["name"], record["role"])


#: What a user name looks like: it appears in logs, error briefs and the admin command's output.
NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
_NAME_RE: Final = re.compile(NAME_PATTERN)


@dataclass(frozen=True)
class UserSummary:
    """A user as `list-users` shows it: never a token, only how many live ones they hold."""

    user: User
    tokens: int
    created_at: datetime
    disabled_at: datetime | None = None
    #: Their fair share (operators set it) and decayed usage in CPU-seconds as of
    #: `usage_at`, as the leading scheduler last charged it.
    share: float = 1.0
    usage: float = 0.0
    usage_at: datetime | None = None
    #: The bytes they keep in the object store, and their own quota of those (None: the
    #: installation's; 0: none): `shared/store/quota_repo.py`.
    stored_bytes: int = 0
    store_quota_bytes: int | None = None


@dataclass(frozen=True)
class TokenSummary:
    """A token as operators see it: its public id, never the token or its hash."""

    id: str
    user: str
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def check_name(name: str) -> str:
    """Return `name` if it is a valid user name; raise ValueError saying what one looks like."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"user name {name[:100]!r} is not valid: 1 to 64 letters, digits or '._@-',"
            " starting with a letter or digit"
        )
    return name


async def create_user(conn: Connection, name: str, role: Role) -> User:
    """Create user `name`; raises `Conflict` if the name is taken, ValueError if malformed.
    Locks: none beyond the row it inserts (a taken name's row is not locked)."""
    record = await conn.fetchrow(
        "INSERT INTO users (id, name, role) VALUES ($1, $2, $3)"
        " ON CONFLICT (name) DO NOTHING RETURNING id, name, role",
        new_id("u"),
        check_name(name),
        role,
    )
    if record is None:
        raise Conflict(
            f"a user named {name!r} already exists",
            next_step=f"pick another name, or give them a new token (`vigil new-token {name}`)",
        )
    return User(record["id"], record["name"], record["role"])


_TOKEN_COLUMNS: Final = "t.id, u.name AS user, t.label, t.created_at, t.revoked_at"


async def add_token(
    conn: Connection, name: str, token: str, label: str | None = None
) -> TokenSummary:
    """Give user `name` one more token (stored hashed); raises `NotFound` for an unknown user.
    Locks: none beyond the row it inserts, plus a key-share lock on the user's row."""
    hashed = hash_token(token)
    record = await conn.fetchrow(
        "WITH added AS (INSERT INTO tokens (token_hash, user_id, id, label)"
        "  SELECT $1, id, $2, $3 FROM users WHERE name = $4 RETURNING *)"
        f" SELECT {_TOKEN_COLUMNS} FROM added t JOIN users u ON u.id = t.user_id",
        hashed,
        token_id(hashed),
        label,
        name,
    )
    if record is None:
        raise NotFound(f"no user named {name[:100]!r}")
    return TokenSummary(**dict(record))


async def list_users(conn: Connection, name: str | None = None) -> list[UserSummary]:
    """Every user by name (or only `name`), with the number of live tokens each holds."""
    rows = await conn.fetch(
        "SELECT u.id, u.name, u.role, u.created_at, u.disabled_at, u.share, u.usage,"
        " u.usage_at, u.stored_bytes, u.store_quota_bytes,"
        " count(t.token_hash) FILTER (WHERE t.revoked_at IS NULL) AS tokens"
        " FROM users u LEFT JOIN tokens t ON t.user_id = u.id"
        " WHERE $1::text IS NULL OR u.name = $1"
        " GROUP BY u.id ORDER BY u.name",
        name,
    )
    return [
        UserSummary(
            User(r["id"], r["name"], r["role"]),
            int(r["tokens"]),
            r["created_at"],
            r["disabled_at"],
            share=float(r["share"]),
            usage=float(r["usage"]),
            usage_at=r["usage_at"],
            stored_bytes=int(r["stored_bytes"]),
            store_quota_bytes=r["store_quota_bytes"],
        )
        for r in rows
    ]


async def list_tokens(conn: Connection, name: str) -> list[TokenSummary]:
    """User `name`'s tokens, oldest first, revoked ones included; `NotFound` for no such user."""
    if await conn.fetchval("SELECT id FROM users WHERE name = $1", name) is None:
        raise NotFound(f"no user named {name[:100]!r}")
    rows = await conn.fetch(
        f"SELECT {_TOKEN_COLUMNS} FROM tokens t JOIN users u ON u.id = t.user_id"
        " WHERE u.name = $1 ORDER BY t.created_at, t.id",
        name,
    )
    return [TokenSummary(**dict(r)) for r in rows]


async def revoke_token(conn: Connection, token_id: str) -> TokenSummary:
    """Revoke token `token_id` (idempotent: a revoked one keeps its first revocation time);
    `NotFound` for no such token. Locks: the token's row (its UPDATE)."""
    record = await conn.fetchrow(
        "WITH revoked AS (UPDATE tokens SET revoked_at = coalesce(revoked_at, now())"
        " WHERE id = $1 RETURNING *)"
        f" SELECT {_TOKEN_COLUMNS} FROM revoked t JOIN users u ON u.id = t.user_id",
        token_id,
    )
    if record is None:
        raise NotFound(f"no token {token_id[:100]!r}")
    return TokenSummary(**dict(record))


async def disable_user(conn: Connection, name: str) -> UserSummary:
    """Disable user `name`: none of their tokens works any more (idempotent); `NotFound` for
    no such user. Their jobs are left as they are (an operator cancels them if need be).
    Locks: the user's row (its UPDATE); not their tokens."""
    status = await conn.execute(
        "UPDATE users SET disabled_at = coalesce(disabled_at, now()) WHERE name = $1", name
    )
    if status.endswith(" 0"):
        raise NotFound(f"no user named {name[:100]!r}")
    [found] = await list_users(conn, name)
    return found


async def set_share(conn: Connection, name: str, share: float) -> UserSummary:
    """Give user `name` the fair share `share` (> 0; the next planning round uses it);
    `NotFound` for no such user. Locks: the user's row (its UPDATE)."""
    status = await conn.execute("UPDATE users SET share = $2 WHERE name = $1", name, share)
    if status.endswith(" 0"):
        raise NotFound(f"no user named {name[:100]!r}")
    [found] = await list_users(conn, name)
    return found


async def open_session(conn: Connection, user: User, ttl_s: float) -> str:
    """A new dashboard session for `user`: a token of its own, valid `ttl_s` unless revoked
    sooner (`close_session`), for the cookie (never the token the user signed in with).
    Locks: the user's expired session rows it deletes, and a key-share lock on the user's row
    (the new token's foreign key)."""
    token = new_token()
    hashed = hash_token(token)
    await conn.execute(  # the user's expired sessions go (one row per sign-in otherwise)
        "WITH expired AS (DELETE FROM tokens WHERE user_id = $2 AND session"
        "  AND expires_at < now())"
        " INSERT INTO tokens (token_hash, user_id, id, label, session, expires_at)"
        " VALUES ($1, $2, $3, 'dashboard session', true, now() + make_interval(secs => $4))",
        hashed,
        user.id,
        token_id(hashed),
        ttl_s,
    )
    return token


async def close_session(conn: Connection, token: str) -> bool:
    """Revoke `token` if it is a dashboard session (a bearer token is left alone); whether it
    was one still open. Locks: the token's row if it is an open session (its UPDATE)."""
    status = await conn.execute(
        "UPDATE tokens SET revoked_at = now()"
        " WHERE token_hash = $1 AND session AND revoked_at IS NULL",
        hash_token(token),
    )
    return status.endswith(" 1")
