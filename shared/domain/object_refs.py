"""Objects of the store named by reference: a job's file, or an object an input names, given
as `{"url": URL, "sha256": HEX}` and staged into each task's work dir by its path there,
checked against that sha256 (`shared/host/object_cache.py`).

A URL names an object of the installation's store: the store's URL (`VIGIL_STORE_URL`,
`s3://BUCKET/PREFIX` or `file:///DIR`), a `/`, and the object's key under it. An input names
its objects under the reserved key `objects`, a map of path to reference, beside whatever else
it holds: `{"sample": "S1", "objects": {"reads.bam": {"url": ..., "sha256": ...}}}`. The rules
of a reference's form are here; whether the object is there and the user may read it is the
api's to check (`services/api/object_check.py`).
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.domain import bundle

#: The key of an input that names objects to stage.
OBJECTS_KEY: Final = "objects"
#: Most objects one input names.
MAX_OBJECTS: Final = 100
#: Longest URL of a reference.
MAX_URL: Final = 2048
#: A sha256: 64 lowercase hexadecimal digits.
SHA256: Final = re.compile(r"[0-9a-f]{64}")
_SCHEMES: Final = ("s3://", "file:///")
#: A key's character: printable, no backslash (a key is a path of a directory store too).
_KEY_CHARS: Final = re.compile(r"[\x21-\x5b\x5d-\x7e\u00a0-\U0010ffff]+")


@dataclass(frozen=True)
class ObjectRef:
    """One object to stage: where in the work dir, from which URL, with which sha256."""

    path: str
    url: str
    sha256: str
    executable: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"url": self.url, "sha256": self.sha256}


def url_problem(url: str) -> str | None:
    """Why `url` cannot name an object (None: its form can): an `s3://BUCKET/KEY` or
    `file:///DIR/KEY` URL of plain printable characters, no `.` or `..` or empty part."""
    if not 0 < len(url) <= MAX_URL:
        return f"a URL must have 1 to {MAX_URL} characters"
    if not url.startswith(_SCHEMES):
        return f"{url[:200]!r} is not an s3:// or file:/// URL"
    rest = url.split("://", 1)[1].lstrip("/")
    parts = rest.split("/")
    if len(parts) < 2 or any(part in ("", ".", "..") for part in parts):
        return (
            f"{url[:200]!r} does not name an object (BUCKET/KEY, with no empty, '.' or '..' part)"
        )
    if not _KEY_CHARS.fullmatch(rest.replace("/", "")):
        return f"{url[:200]!r} has a space, a control character or a backslash"
    return None


def sha256_problem(sha256: str) -> str | None:
    if SHA256.fullmatch(sha256):
        return None
    return f"{sha256[:100]!r} is not a sha256 (64 lowercase hexadecimal digits)"


def key_in(store_url: str, url: str) -> str | None:
    """The object's key when `url` is in the store at `store_url` (None: it is not)."""
    base = store_url.rstrip("/") + "/"
    return url[len(base) :] if url.startswith(base) and len(url) > len(base) else None


def names_objects(value: Any) -> bool:
    """Whether an input names objects to stage (see `input_objects`)."""
    return isinstance(value, dict) and OBJECTS_KEY in value


def input_objects(value: Any) -> list[ObjectRef]:
    """The objects an input names (`objects`), or a `ValueError` saying what is wrong."""
    if not names_objects(value):
        return []
    named = value[OBJECTS_KEY]
    if not isinstance(named, dict) or not named:
        raise ValueError(
            f"an input's {OBJECTS_KEY!r} must be a map of path to"
            ' {"url": ..., "sha256": ...} (it is reserved for objects to stage)'
        )
    if len(named) > MAX_OBJECTS:
        raise ValueError(f"an input names at most {MAX_OBJECTS} objects ({len(named)} given)")
    return [_ref(path, ref) for path, ref in named.items()]


def _ref(path: str, ref: Any) -> ObjectRef:
    problem = bundle.path_problem(path)
    if problem is None and (
        not isinstance(ref, Mapping) or set(ref) != {"url", "sha256"} or not _texts(ref)
    ):
        problem = f'object {path!r} must be {{"url": ..., "sha256": ...}}, both text'
    if problem is None:
        problem = url_problem(ref["url"]) or sha256_problem(ref["sha256"])
    if problem is not None:
        raise ValueError(f"{OBJECTS_KEY}: {problem}")
    return ObjectRef(path, ref["url"], ref["sha256"])


def _texts(ref: Mapping[str, Any]) -> bool:
    return all(isinstance(ref[k], str) for k in ("url", "sha256"))
