"""Removing work dirs on this host (`RemoveWorkdirs`: a purged job, thrown-away test tasks).

Only what lies inside this worker's work root is ever deleted: a path anywhere else is refused
and logged. A work dir that is a symbolic link loses the link, never what it points to.
Idempotent: a dir already gone counts as removed.
"""

import asyncio
import contextlib
import logging
import os
import shutil
from pathlib import Path

from shared.domain.bundle import HOST_DIR
from shared.domain.ids import is_safe_id
from shared.domain.messages import RemoveWorkdirs

logger = logging.getLogger(__name__)


def inside(root: Path, workdir: str) -> Path | None:
    """The path to delete for `workdir` when it lies strictly inside `root` (resolved, as is
    its parent; the last part is kept as it is, so a link is not followed); else None."""
    path = Path(workdir)
    if not path.is_absolute() or path.name in ("", ".", ".."):
        return None
    target = path.parent.resolve() / path.name
    if target == root or not target.is_relative_to(root):
        return None
    return target


def _remove(target: Path) -> bool:
    """Delete `target` (a tree, a file or a link); False when it was not there."""
    if target.is_symlink() or target.is_file():
        target.unlink(missing_ok=True)
        return True
    try:
        shutil.rmtree(target)
    except FileNotFoundError:
        return False
    return True


async def remove_workdirs(work_root: Path, message: RemoveWorkdirs) -> int:
    """Delete the message's work dirs that lie inside `work_root` (in a thread); returns how
    many existed. Then the job's dir under the root goes too if it is empty. Raises `OSError`
    when a dir cannot be deleted (the message is then delivered again)."""
    removed = await asyncio.to_thread(_remove_all, work_root, message)
    logger.info(
        "removed %d of %d work dir(s) of job %s (%s)",
        removed,
        len(message.workdirs),
        message.job_id,
        message.reason or "no reason given",
        extra={"action": "remove_workdirs", "job_id": message.job_id},
    )
    return removed


def _remove_all(work_root: Path, message: RemoveWorkdirs) -> int:
    root = work_root.resolve()
    removed = 0
    for workdir in message.workdirs:
        target = inside(root, workdir)
        if target is None:
            logger.error(
                "refusing to remove %r: not inside the work root %s",
                workdir,
                root,
                extra={"action": "remove_workdirs", "job_id": message.job_id},
            )
            continue
        removed += _remove(target)
    if is_safe_id(message.job_id):
        job_dir = root / message.job_id
        with contextlib.suppress(OSError):  # gone
            if all(entry.startswith(HOST_DIR) for entry in os.listdir(job_dir)):
                for entry in os.listdir(job_dir):  # the job's files: fetched again if needed
                    shutil.rmtree(job_dir / entry, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty (another task's dir), or gone
            os.rmdir(job_dir)
    return removed
