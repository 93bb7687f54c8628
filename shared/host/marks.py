"""`VIGIL_MARK`: the environment variable that ties a command's processes to their task.

Set by the worker on every command it starts and inherited by all their descendants (even those
that leave the process group), it lets the supervisor find them from /proc alone.
"""

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from uuid import UUID

VARIABLE: Final = "VIGIL_MARK"
_MARK: Final = VARIABLE.encode() + b"="


def mark(namespace: str, host_id: str, task_id: str, claim: UUID) -> str:
    """The value of `VIGIL_MARK` for a command of `task_id` under `claim`."""
    return f"{namespace}/{host_id}/{task_id}/{claim.hex}"


@dataclass(frozen=True)
class Marked:
    pid: int
    task_id: str
    claim: UUID


def marked_processes(namespace: str, host_id: str) -> list[Marked]:
    """Every process of this installation's commands on this host (read from /proc)."""
    prefix = _MARK + f"{namespace}/{host_id}/".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(prefix):
                task_id, _, claim = var[len(prefix) :].decode(errors="replace").partition("/")
                with contextlib.suppress(ValueError):
                    found.append(Marked(int(entry), task_id, UUID(hex=claim)))
                break
    return found
