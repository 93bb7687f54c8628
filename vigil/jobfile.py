"""Job files: the body of `POST /jobs` written as YAML or JSON.

A `.json` file is read as JSON, anything else as YAML (which JSON also is). The result must be
a mapping of JSON values: YAML's dates, sets and binary values, and non-finite numbers, are
refused with the place they were found, rather than failing later inside the HTTP client.
The API checks the fields themselves (its 422 names the one at fault).
"""

import base64
import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Final

import yaml

from vigil.errors import JobFileError

#: Largest job file read; the API's own body limit is about this size too.
MAX_FILE_BYTES: Final = 4 * 1024 * 1024
#: A job's files are sent in its body while they are at most this in all (the api's limit);
#: past it, each one over `UPLOAD_FROM_BYTES` goes to the store first.
INLINE_BYTES: Final = 8 * 1024 * 1024
UPLOAD_FROM_BYTES: Final = 1024 * 1024

#: Puts a file in the store; its reference `{"url", "sha256"}` (`Client.upload`).
Upload = Callable[[Path], dict[str, str]]


def load(path: Path) -> dict[str, Any]:
    """The job in the file at `path`; raises `JobFileError` saying what is wrong and where."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise JobFileError(f"{path}: {size} bytes; job files are at most {MAX_FILE_BYTES}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"cannot read job file {path}: {exc}") from exc
    return parse(text, str(path), as_json=path.suffix.lower() == ".json")


def parse(text: str, name: str, *, as_json: bool = False) -> dict[str, Any]:
    """The job in `text` (YAML, or JSON when `as_json`); `name` is used in error messages."""
    try:
        data = json.loads(text) if as_json else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise JobFileError(f"{name}: not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise JobFileError(f"{name}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if data is None:
        raise JobFileError(f"{name}: the file is empty; a job needs at least a command")
    if not isinstance(data, dict):
        raise JobFileError(
            f"{name}: a job file holds a mapping (name: ..., command: ...), not a"
            f" {type(data).__name__}"
        )
    check_json(data, "")
    return data


def with_files(
    body: dict[str, Any],
    base: Path,
    files: list[Path],
    dirs: list[Path],
    upload: Upload | None = None,
) -> dict[str, Any]:
    """`body` with its `files` (a list of paths in the job file, relative to `base`, its
    directory: a directory stands for every file under it) and the `--file`/`--dir` given
    (each placed by its own name) in the API's form: path -> base64 bytes and whether it is
    executable. Past `INLINE_BYTES` in all, each file over `UPLOAD_FROM_BYTES` is put in the
    store with `upload` (`Client.upload`) and named by its URL and sha256 instead.
    `JobFileError` for a path that is missing or not a file or dir."""
    named = body.get("files", [])
    if isinstance(named, dict):  # already in the API's form
        return body
    if not isinstance(named, list) or not all(isinstance(p, str) for p in named):
        raise JobFileError("files: a list of paths, relative to the job file's directory")
    found: dict[str, Path] = {}
    for given in named:
        _add(found, base / given, PurePosixPath(os.path.normpath(given)))
    for path in [*files, *dirs]:
        _add(found, path, PurePosixPath(path.resolve().name))
    if not found:
        return body
    sizes = {name: path.stat().st_size for name, path in found.items()}
    uploading = upload if sum(sizes.values()) > INLINE_BYTES else None
    return body | {
        "files": {
            name: _given(path, uploading if sizes[name] > UPLOAD_FROM_BYTES else None)
            for name, path in sorted(found.items())
        }
    }


def _given(path: Path, upload: Upload | None) -> dict[str, Any]:
    """One file in the API's form: its bytes, or (`upload`) its reference in the store."""
    executable = bool(path.stat().st_mode & stat.S_IXUSR)
    if upload is not None:
        return {**upload(path), "executable": executable}
    return {"content": base64.b64encode(path.read_bytes()).decode(), "executable": executable}


def with_request(
    body: dict[str, Any],
    *,
    cpus: float | None = None,
    memory_mb: int | None = None,
    gpus: int | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """`body` with the request and priority given on the command line in place of the job
    file's (`resources: {cpus, memory_mb, gpus}`, `priority:`): each one given replaces the
    file's, the others of the file stay. `JobFileError` when the file's `resources` is not a
    mapping; the API checks the values (its 422 names the one at fault)."""
    given = {"cpus": cpus, "memory_mb": memory_mb, "gpus": gpus}
    given = {key: value for key, value in given.items() if value is not None}
    named = body.get("resources")
    if named is not None and not isinstance(named, dict):
        raise JobFileError("resources: a mapping, e.g. {cpus: 2, memory_mb: 4096, gpus: 1}")
    changed = dict(body)
    if given:
        changed["resources"] = (named or {}) | given
    if priority is not None:
        changed["priority"] = priority
    return changed


def _add(found: dict[str, Path], path: Path, name: PurePosixPath) -> None:
    if name.is_absolute() or ".." in name.parts:
        raise JobFileError(f"{name}: files are named by paths inside the job's directory")
    if path.is_file():
        found[str(name)] = path
    elif path.is_dir():
        for inner in sorted(p for p in path.rglob("*") if p.is_file()):
            found[str(name / inner.relative_to(path).as_posix())] = inner
    else:
        raise JobFileError(f"{path}: no such file or directory (named in files)")


def check_json(value: Any, where: str) -> None:
    """Raise `JobFileError` naming the first place in `value` that is not a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise JobFileError(f"{where or 'the job'}: key {key!r} must be a string")
            check_json(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_json(item, f"{where}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise JobFileError(f"{where}: {value} is not a JSON number")
    elif not isinstance(value, str | int | float | bool) and value is not None:
        raise JobFileError(
            f"{where}: {value!r} (a {type(value).__name__}) is not a JSON value; quote it"
        )


def json_or_text(text: str) -> Any:
    """`text` as a JSON value when it is one (`3`, `{"seed": 1}`, `"a"`), else the string."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    check_json(value, "the input")
    return value
