"""The command's own diagnosis in `$VIGIL_STATUS_FILE` (design §3): read warily, then parsed."""

import os
import stat
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from shared.domain.status_report import StatusReport
from shared.host.job_files import UnsafeFile, read_regular

#: A status file larger than this is refused (it is a short JSON object, `resume` included).
MAX_STATUS_BYTES: Final = 1 << 20


def surely_absent(workdir: Path, path: Path) -> bool:
    """Whether there is no status file at `path` (inside `workdir`), as `read_status` would
    find: every directory on the way a real directory (no link followed) and nothing at
    `path`. Two `lstat`s, cheap enough for the event loop; False when unsure."""
    here = workdir
    for part in path.relative_to(workdir).parts[:-1]:
        here = here / part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return False
        except OSError:
            return False
    return not os.path.lexists(path)


def read_status(workdir: Path, path: Path) -> StatusReport | None:
    """The report at `path` (inside `workdir`); None if there is none. A malformed file reads
    as `fatal`, and so does one that is not a plain regular file of the work dir (a FIFO, a
    device, a symbolic link, over `MAX_STATUS_BYTES`): the job made it, and it is never
    followed or waited on (`shared.host.job_files`). Blocking I/O: call it off the event loop."""
    try:
        text = read_regular(workdir, path.relative_to(workdir), max_bytes=MAX_STATUS_BYTES)
    except FileNotFoundError:
        return None
    except (UnsafeFile, ValueError) as exc:
        return StatusReport(status="fatal", message=f"unusable status file: {exc}")
    try:
        return StatusReport.model_validate_json(text)
    except ValidationError as exc:
        return StatusReport(status="fatal", message=f"unreadable status file: {exc}")
