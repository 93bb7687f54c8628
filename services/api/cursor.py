"""Opaque page cursors for `GET /jobs`: base64url of JSON `[created_at, id]` of the last row."""

import base64
import binascii
import json
from datetime import UTC, datetime

from shared.ids import is_safe_id

#: Longest cursor string accepted (a real one is about 70 characters).
MAX_CURSOR_CHARS = 200


def encode(created_at: datetime, job_id: str) -> str:
    """The cursor that continues after the job (created_at, job_id) in newest-first order."""
    raw = json.dumps([created_at.isoformat(), job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor stands for; raises ValueError for anything not made here."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, job_id = json.loads(raw)
        created_at = datetime.fromisoformat(stamp)
        if created_at.tzinfo is None or not isinstance(job_id, str) or not is_safe_id(job_id):
            raise ValueError("not a cursor made by this api")
        # Normalised here: an extreme offset must fail now, not when asyncpg encodes it.
        return created_at.astimezone(UTC), job_id
    except (binascii.Error, ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"cursor {cursor[:50]!r} is malformed") from exc
