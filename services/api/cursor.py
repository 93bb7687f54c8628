"""Opaque page cursors: base64url of the JSON list of the last row's sort key.

`GET /jobs` uses `[created_at, id]` (`encode` / `decode`); other listings pack their own keys
with `pack` / `unpack` and check the values themselves.
"""

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from shared.domain.ids import is_safe_id

#: Longest cursor string accepted (a real one is about 70 characters).
MAX_CURSOR_CHARS = 200


def pack(values: list[Any]) -> str:
    """The cursor holding `values` (JSON values)."""
    raw = json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unpack(cursor: str) -> list[Any]:
    """The values a cursor holds; raises ValueError when it is not a packed JSON list."""
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"cursor {cursor[:50]!r} is malformed") from exc
    if not isinstance(values, list):
        raise ValueError(f"cursor {cursor[:50]!r} is malformed")
    return values


def encode(created_at: datetime, job_id: str) -> str:
    """The cursor that continues after the job (created_at, job_id) in newest-first order."""
    return pack([created_at.isoformat(), job_id])


def decode(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor stands for; raises ValueError for anything not made here."""
    try:
        stamp, job_id = unpack(cursor)
        created_at = datetime.fromisoformat(stamp)
        if created_at.tzinfo is None or not isinstance(job_id, str) or not is_safe_id(job_id):
            raise ValueError("not a cursor made by this api")
        # Normalised here: an extreme offset must fail now, not when asyncpg encodes it.
        return created_at.astimezone(UTC), job_id
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"cursor {cursor[:50]!r} is malformed") from exc
