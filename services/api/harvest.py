"""Views and checks of harvest and cleanup: listed outputs, their page cursor, the
download's answer (a refusal, a byte range), and the retention a submission may ask for.
"""

import re
from typing import Any, Final
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError

from services.api import cursor
from services.api.errors import invalid
from services.api.schemas.common import MAX_OUTPUT_CHARS, OutputName
from shared.domain.errors import Refusal
from shared.domain.purge_rules import purged_message
from shared.store.jobs_repo import Job
from shared.store.outputs_repo import StoredOutput

#: Longest output page cursor accepted (an index and a name of up to 255 characters).
MAX_OUTPUT_CURSOR_CHARS: Final = 2000
_INT4: Final = 2**31
_NAME: TypeAdapter[str] = TypeAdapter(OutputName)
_UNSAFE_IN_FILENAME: Final = re.compile(r"[^A-Za-z0-9._-]")
_OPEN_RANGE: Final = re.compile(r"bytes=(\d{1,19})-")


def check_name(name: str, loc: tuple[str, ...] = ("path", "name")) -> str:
    """`name` if it is a plain output file name (as in `POST /jobs`); a 422 naming `loc`."""
    try:
        return _NAME.validate_python(name)
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise invalid(loc, message) from exc


def encode_after(output: StoredOutput) -> str:
    """The cursor that continues after `output`."""
    return cursor.pack([output.index, output.name])


def decode_after(text: str) -> tuple[int, str]:
    """The (task index, name) a cursor of `encode_after` holds; a 422 otherwise."""
    loc = ("query", "cursor")
    try:
        index, name = cursor.unpack(text)
    except ValueError as exc:
        raise invalid(loc, f"cursor {text[:50]!r} is malformed") from exc
    if not isinstance(index, int) or isinstance(index, bool) or not -_INT4 <= index < _INT4:
        raise invalid(loc, f"cursor {text[:50]!r} is malformed")
    if not isinstance(name, str) or len(name) > MAX_OUTPUT_CHARS:
        raise invalid(loc, f"cursor {text[:50]!r} is malformed")
    return index, check_name(name, loc)


def refusal(output: StoredOutput, job: Job, content: bytes | None) -> Refusal | None:
    """Why `output` cannot be downloaded (a 409), or None: it is in the object store (or, for
    an output recorded before outputs went there, its bytes were kept: `content`)."""
    if job.purged_at is not None:
        gone = purged_message(job.id, job.purged_at, job.purged_by)
        return Refusal(
            f"{gone}: output {output.name} was deleted",
            "it is gone for good; run the task's input again in a new job",
        )
    if output.object_key is not None or content is not None:
        return None
    return Refusal(
        f"output {output.name} ({output.size} bytes) was recorded before outputs were kept in"
        " the object store, and its bytes were not kept",
        "run the task's input again in a new job to have it stored",
    )


def missing(output: StoredOutput) -> Refusal:
    """The refusal of an output whose object is no longer in the store."""
    return Refusal(
        f"output {output.name} is recorded under {output.object_key}, which the object store no"
        " longer holds (removed outside Vigil)",
        "run the task's input again in a new job",
    )


def byte_range(header: str | None, size: int) -> int | None:
    """The offset an open-ended `Range: bytes=N-` asks for (None: no such header, or another
    form, which is answered with the whole file); `ValueError` for an offset past the end."""
    if header is None:
        return None
    match = _OPEN_RANGE.fullmatch(header.strip())
    if match is None:
        return None
    offset = int(match.group(1))
    if offset >= size and size > 0:
        raise ValueError(f"the output has {size} bytes: nothing from byte {offset}")
    return offset


def attachment(name: str) -> str:
    """A `Content-Disposition` value that saves the file as `name`: an ASCII fallback with
    every other character replaced by `_`, and the exact name UTF-8 encoded (RFC 6266)."""
    fallback = _UNSAFE_IN_FILENAME.sub("_", name).lstrip(".") or "output"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def check_retention(retention_s: float | None, minimum_s: float) -> None:
    """A 422 on `retention_s` when it is shorter than the api's minimum."""
    if retention_s is not None and retention_s < minimum_s:
        raise invalid(
            ("body", "retention_s"),
            f"retention_s is {retention_s:g} s; the shortest this api accepts is {minimum_s:g} s",
        )


#: The OpenAPI description of a download's answers.
DOWNLOAD_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {
        "description": "The file's bytes, as recorded (sha256 in `ETag`), from a directory store.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    206: {"description": "The bytes from the offset of `Range: bytes=N-` on (a resumed download)."},
    307: {
        "description": "An S3 store: `Location` is a link to the object that works for"
        " `VIGIL_DOWNLOAD_LINK_S` seconds, for any client, without a token (Range works there)."
    },
    404: {"description": "No such task or output, or the task is another user's."},
    409: {"description": "The job was purged, or the output is not in the store: says why."},
    416: {"description": "`Range` starts past the end of the file."},
    503: {"description": "The object store failed to answer: try again."},
}
