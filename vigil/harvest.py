"""`vigil outputs` and `vigil download`: how outputs show, where a download is saved, and a
download to a file that resumes and is checked (`fetch`)."""

import hashlib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
from rich.table import Table

from vigil import calls
from vigil.calls import check_output_name
from vigil.errors import BadResponse, UsageError
from vigil.render import cell

#: `-o -`: write the bytes to standard output.
STDOUT: Final = "-"


#: What a download being written is called beside its file, until it is whole and checked.
PART_SUFFIX: Final = ".part"
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class Fetched:
    """A file downloaded by `fetch`: its size, and the byte it resumed from (0: from the
    start; None: it was there already, whole)."""

    size: int
    resumed_from: int | None


def fetch(http: httpx.Client, request: dict[str, Any], dest: Path, sha256: str) -> Fetched:
    """Download `request` (a `Call.request_args`) into `dest`, streamed, through
    `dest.part`: a `.part` left by a cut download is continued with a ranged read (`Range:
    bytes=N-`), and `dest` appears only once the whole file's sha256 is `sha256` (else
    `BadResponse`; a resumed one that does not match is fetched again whole, once). A `dest`
    that is already the file is left as it is."""
    if dest.is_file() and _sha256_of(dest) == sha256:
        return Fetched(dest.stat().st_size, None)
    part = dest.with_name(dest.name + PART_SUFFIX)
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    got, resumed = _stream(http, request, part, have), have
    if got != sha256 and resumed:  # what was there was not the file's start
        got, resumed = _stream(http, request, part, 0), 0
    if got != sha256:
        part.unlink(missing_ok=True)
        raise BadResponse(
            f"{dest.name}: the bytes received do not match its sha256 {sha256}: the download"
            " was damaged, try again"
        )
    os.replace(part, dest)
    return Fetched(dest.stat().st_size, resumed)


def _stream(http: httpx.Client, request: dict[str, Any], part: Path, offset: int) -> str:
    """Write the answer into `part` from `offset` (asked for with `Range`); the sha256 of the
    whole of `part` then."""
    headers = dict(request.get("headers") or {})
    if offset:
        headers["Range"] = f"bytes={offset}-"
    digest = hashlib.sha256()
    with http.stream(**(request | {"headers": headers, "follow_redirects": True})) as response:
        if response.status_code == httpx.codes.REQUESTED_RANGE_NOT_SATISFIABLE:
            return _sha256_of(part)  # it was whole already
        if not response.is_success:
            response.read()
            calls.result(response)  # raises the api's refusal
        if response.status_code != httpx.codes.PARTIAL_CONTENT:
            offset = 0  # the whole file came: start over
        with part.open("r+b" if part.exists() else "wb") as out:
            out.truncate(offset)
            _hash_into(digest, out, offset)
            out.seek(offset)
            for chunk in response.iter_bytes(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    return digest.hexdigest()


def _hash_into(digest: "hashlib._Hash", handle: Any, size: int) -> None:
    handle.seek(0)
    left = size
    while left and (chunk := handle.read(min(_CHUNK, left))):
        digest.update(chunk)
        left -= len(chunk)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def outputs_table(outputs: Iterable[Mapping[str, Any]]) -> Table:
    """One row per output: task index and id, name, size, sha256 (start), downloadable, and
    where the file is (host:path)."""
    table = Table("INDEX", "TASK", "NAME", "BYTES", "SHA256", "DOWNLOAD", "AT", box=None)
    for output in outputs:
        table.add_row(
            cell(output.get("index")),
            cell(output.get("task_id")),
            cell(output.get("name")),
            cell(output.get("size")),
            cell(str(output.get("sha256", ""))[:12]),
            cell("yes" if output.get("downloadable") else "no"),
            cell(f"{output.get('host') or '?'}:{output.get('path')}"),
        )
    return table


def target(name: str, output: str | None, force: bool) -> str:
    """Where to save output `name`: `output`, else `name` in the current directory; `-` is
    standard output. Refuses (`UsageError`) a name that is not a plain file name (it would be
    the path saved to), and to overwrite a file unless `force`."""
    chosen = output if output is not None else check_output_name(name)
    if chosen != STDOUT and Path(chosen).exists() and not force:
        raise UsageError(f"{chosen} exists: choose another file with -o, or --force")
    return chosen


def save(data: bytes, where: str) -> None:
    """Write `data` to the file `where`, or to standard output for `-`."""
    if where == STDOUT:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        Path(where).write_bytes(data)
    except OSError as exc:
        raise UsageError(f"cannot write {where}: {exc.strerror or exc}") from exc
