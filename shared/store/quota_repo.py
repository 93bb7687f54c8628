"""The bytes each user keeps in the object store, against their quota
(`shared/domain/store_quota.py`): `users.stored_bytes`, a counter changed in the very
transactions that store bytes or give them back (migration 0051), so that no check sums a
user's outputs.

- a task's completion adds the bytes of the outputs it records (`charge_job`, refused past the
  quota: the transaction then rolls back);
- an upload handed out (`POST /uploads`) adds its size once per (user, sha256)
  (`record_upload`), corrected to the size the store holds when the api sees it there;
- a purge gives back the bytes of its job's outputs (`give_back_job`, in the transaction that
  marks the job purged); a user's deleting an upload gives its size back (`forget_upload`).

Locks: the user's row, last in each of these transactions (after the task's, or the job's):
one order for every writer, so none waits on another in a cycle.
"""

from shared.domain.errors import NotFound
from shared.domain.store_quota import OverQuota, Usage
from shared.store.db import Connection


async def of_user(conn: Connection, user_id: str, default: int) -> Usage:
    """User `user_id`'s stored bytes and limit (`default`: the installation's)."""
    return await _usage(conn, "u.id = $1", user_id, default, f"no user {user_id!r}")


async def of_job(conn: Connection, job_id: str, default: int) -> Usage:
    """The stored bytes and limit of the owner of job `job_id`."""
    where = "u.id = (SELECT owner_id FROM jobs WHERE id = $1)"
    return await _usage(conn, where, job_id, default, f"no job {job_id!r}")


async def _usage(conn: Connection, where: str, key: str, default: int, missing: str) -> Usage:
    row = await conn.fetchrow(
        "SELECT u.name, u.stored_bytes, coalesce(u.store_quota_bytes, $2) AS quota FROM users u"
        f" WHERE {where}",
        key,
        default,
    )
    if row is None:
        raise NotFound(missing)
    return Usage(row["name"], int(row["stored_bytes"]), int(row["quota"]))


async def charge_job(conn: Connection, job_id: str, size: int, default: int, what: str) -> Usage:
    """Add `size` bytes (less than 0: give back) to the stored bytes of job `job_id`'s owner,
    in the caller's transaction; the usage after. `OverQuota` (naming `what`) when more bytes
    would go over the owner's limit: the caller's transaction must then roll back. Locks: the
    owner's row."""
    row = await conn.fetchrow(
        "UPDATE users u SET stored_bytes = greatest(0, u.stored_bytes + $2)"
        " FROM jobs j WHERE j.id = $1 AND u.id = j.owner_id"
        " RETURNING u.name, u.stored_bytes, coalesce(u.store_quota_bytes, $3) AS quota",
        job_id,
        size,
        default,
    )
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    return _checked(row, size, what)


async def record_upload(
    conn: Connection, user_id: str, sha256: str, size: int, default: int
) -> Usage:
    """Count the file of `sha256` (`size` bytes) that user `user_id` uploads, once (a file
    recorded already changes nothing), in the caller's transaction; the usage after.
    `OverQuota` when it would go over the user's limit (the transaction must roll back).
    Locks: the upload's new row and the user's row."""
    inserted = await conn.fetchval(
        "INSERT INTO uploads (user_id, sha256, size) VALUES ($1, $2, $3)"
        " ON CONFLICT DO NOTHING RETURNING size",
        user_id,
        sha256,
        size,
    )
    if inserted is None:
        return await of_user(conn, user_id, default)
    row = await conn.fetchrow(
        "UPDATE users SET stored_bytes = stored_bytes + $2 WHERE id = $1"
        " RETURNING name, stored_bytes, coalesce(store_quota_bytes, $3) AS quota",
        user_id,
        size,
        default,
    )
    return _checked(row, size, f"upload {sha256}")


async def correct_upload(conn: Connection, user_id: str, sha256: str, size: int) -> None:
    """The store holds `size` bytes for user `user_id`'s upload of `sha256`: count those
    (recording the upload if it was not), whatever size was given when it was handed out.
    Never refused: the bytes are stored already. Locks: the upload's row and the user's."""
    old = await conn.fetchval(
        "WITH old AS (SELECT size FROM uploads WHERE user_id = $1 AND sha256 = $2 FOR UPDATE),"
        " put AS (INSERT INTO uploads (user_id, sha256, size) VALUES ($1, $2, $3)"
        "  ON CONFLICT (user_id, sha256) DO UPDATE SET size = EXCLUDED.size)"
        " SELECT coalesce((SELECT size FROM old), 0)",
        user_id,
        sha256,
        size,
    )
    if size != old:
        await conn.execute(
            "UPDATE users SET stored_bytes = greatest(0, stored_bytes + $2) WHERE id = $1",
            user_id,
            size - int(old),
        )


async def upload_size(conn: Connection, user_id: str, sha256: str) -> int | None:
    """The size counted for user `user_id`'s upload of `sha256` (None: none recorded)."""
    size = await conn.fetchval(
        "SELECT size FROM uploads WHERE user_id = $1 AND sha256 = $2", user_id, sha256
    )
    return None if size is None else int(size)


async def forget_upload(conn: Connection, user_id: str, sha256: str) -> int:
    """User `user_id` deleted their upload of `sha256`: its record goes and its bytes leave
    their count, in the caller's transaction (idempotent: 0 once forgotten); how many. Locks:
    the upload's row and the user's."""
    size = await conn.fetchval(
        "DELETE FROM uploads WHERE user_id = $1 AND sha256 = $2 RETURNING size", user_id, sha256
    )
    if size is None:
        return 0
    await conn.execute(
        "UPDATE users SET stored_bytes = greatest(0, stored_bytes - $2) WHERE id = $1",
        user_id,
        int(size),
    )
    return int(size)


async def give_back_job(conn: Connection, job_id: str) -> int:
    """Take the bytes of job `job_id`'s stored outputs off its owner's count, in the caller's
    transaction (the one that marks the job purged: once per job); how many. Locks: the
    owner's row."""
    given = await conn.fetchval(
        "WITH s AS (SELECT coalesce(sum(o.size), 0) AS bytes FROM tasks t"
        "  JOIN task_outputs o ON o.task_id = t.id"
        "  WHERE t.job_id = $1 AND o.object_key IS NOT NULL)"
        " UPDATE users u SET stored_bytes = greatest(0, u.stored_bytes - s.bytes)"
        " FROM s, jobs j WHERE j.id = $1 AND u.id = j.owner_id RETURNING s.bytes",
        job_id,
    )
    return int(given or 0)


async def set_limit(conn: Connection, name: str, limit: int | None) -> None:
    """Give user `name` a limit of their own (bytes; 0: none), or the installation's again
    (None); `NotFound` for no such user. Locks: the user's row."""
    status = await conn.execute(
        "UPDATE users SET store_quota_bytes = $2 WHERE name = $1", name, limit
    )
    if status.endswith(" 0"):
        raise NotFound(f"no user named {name[:100]!r}")


def _checked(row: object, size: int, what: str) -> Usage:
    assert row is not None
    after = Usage(row["name"], int(row["stored_bytes"]), int(row["quota"]))  # type: ignore[index]
    before = Usage(after.user, after.used - size, after.limit)
    if size > 0 and not before.room_for(size):
        raise OverQuota(before, size, what)
    return after
