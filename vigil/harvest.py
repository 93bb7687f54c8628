"""`vigil outputs` and `vigil download`: how outputs show, and where a download is saved."""

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from vigil.calls import check_output_name
from vigil.errors import UsageError
from vigil.render import cell

#: `-o -`: write the bytes to standard output.
STDOUT: Final = "-"


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
