"""`vigil tasks`: a job's tasks one a line, as `squeue` or `condor_q` list jobs.

Plain aligned columns, not a rich table: rich takes seconds per 10,000 rows and a job may have
100,000 tasks. No cell is ever cut (a pipe gets whole ids); text from the API goes through
`printable()`.
"""

import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from vigil.render import printable

#: The columns, in order.
HEADER: Final = ("TASK", "INDEX", "STATE", "HOST", "ELAPSED", "PROGRESS", "EXIT", "CLASS")
_GAP: Final = "  "


def elapsed(seconds: float | None) -> str:
    """`squeue`'s form: `M:SS`, `H:MM:SS`, or `D-HH:MM:SS`; `-` when unknown."""
    if seconds is None:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def _ended(task: Mapping[str, Any]) -> str:
    if task.get("exit_code") is not None:
        return str(task["exit_code"])
    number = task.get("signal")
    if number is None:
        return "-"
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def row(task: Mapping[str, Any]) -> tuple[str, ...]:
    """The cells of one task: id, index, state, host, elapsed (in its stage while one runs,
    else its whole run), progress, exit code (or the signal that killed it), failure class."""
    progress = task.get("progress")
    state = task["state"] + (" (superseded)" if task.get("superseded_by") else "")
    cells = (
        task["id"],
        task.get("index"),
        state,
        task.get("host") or "-",
        elapsed(task.get("elapsed_s")),
        "-" if progress is None else f"{progress}%",
        _ended(task),
        task.get("failure_class") or "-",
    )
    return tuple(printable(cell) for cell in cells)


def lines(tasks: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """The header, then a line per task, in aligned columns."""
    rows: Sequence[tuple[str, ...]] = [HEADER, *(row(task) for task in tasks)]
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(HEADER))]
    for cells in rows:
        yield _GAP.join(
            cell.ljust(width) for cell, width in zip(cells, widths, strict=True)
        ).rstrip()
