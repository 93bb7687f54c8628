"""A job's bundle: the files a user submits with a job (scripts, configs, small data), placed
read-only in every task's work dir on any host. As HTCondor's
`transfer_input_files`, but stored once per job in PostgreSQL, checksummed, and never writable
by the job. The rules of a path and the list a job keeps (`jobs.files`) are here; the api
checks a submission against them, the worker places the files (`shared/host/bundle.py`)."""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: Most files in one job's bundle.
MAX_FILES: Final = 1000
#: Most bytes of one job's bundle, all files together (a submission's body is at most 16 MiB,
#: and base64 makes 4 bytes of 3).
MAX_BYTES: Final = 8 * 1024 * 1024
#: Longest path of a file in a bundle.
MAX_PATH: Final = 255
#: One component of a path: letters, digits, `.`, `_`, `+`, `-` (no space, no shell magic).
_COMPONENT: Final = re.compile(r"[A-Za-z0-9._+-]+")
#: Where the worker keeps a job's files on a host: `<work root>/<job>/.files`.
HOST_DIR: Final = ".files"


@dataclass(frozen=True)
class BundleFile:
    """One file of a job's bundle, as the job lists it: its bytes stored with the job, or,
    with a `url`, an object of the store staged on each host through its cache."""

    path: str
    size: int
    sha256: str
    executable: bool
    url: str | None = None

    def as_json(self) -> dict[str, Any]:
        listed = {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "executable": self.executable,
        }
        return listed if self.url is None else {**listed, "url": self.url}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "BundleFile":
        return cls(
            value["path"], value["size"], value["sha256"], value["executable"], value.get("url")
        )


def with_bytes(files: list[dict[str, Any]]) -> list[BundleFile]:
    """The files of a job's list (`jobs.files`) whose bytes are stored with the job (not
    given by reference)."""
    return [BundleFile.from_json(f) for f in files if f.get("url") is None]


def path_problem(path: str) -> str | None:
    """Why `path` cannot name a file of a bundle (None: it can): a relative path of plain
    components, not in `.vigil`."""
    if not path or len(path) > MAX_PATH:
        return f"a file's path must have 1 to {MAX_PATH} characters"
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", "..") or not _COMPONENT.fullmatch(part):
            return (
                f"{path!r} is not a relative path of plain names (letters, digits, '.', '_',"
                " '+', '-'; no empty, '.' or '..' part)"
            )
    if parts[0] == ".vigil":
        return f"{path!r} is in .vigil, the worker's own dir in a work dir"
    return None


def conflicts(paths: list[str], outputs: list[str]) -> list[str]:
    """The problems of a bundle's paths as a whole: a path that is also a directory of
    another, or also an output of the job (the command could not write it: it is read-only)."""
    problems = []
    names = set(paths)
    for path in sorted(paths):
        parts = path.split("/")
        for n in range(1, len(parts)):
            if "/".join(parts[:n]) in names:
                problems.append(f"{'/'.join(parts[:n])!r} is a file and a directory of {path!r}")
        if path in outputs:
            problems.append(f"{path!r} is also an output of the job: files are read-only")
    return problems


def listed(files: Mapping[str, tuple[bytes, bool]]) -> list[BundleFile]:
    """The list a job keeps of its files (path -> (bytes, executable)), by path."""
    return [
        BundleFile(path, len(content), hashlib.sha256(content).hexdigest(), executable)
        for path, (content, executable) in sorted(files.items())
    ]
