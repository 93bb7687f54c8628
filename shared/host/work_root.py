"""Where a host keeps its tasks' work dirs, and whether a confined job can reach its own there.

A confined job runs as a uid of its owner's (`services/worker/confinement.py`), started in its
work dir. Its `$VIGIL_WORKDIR`, `$VIGIL_STATUS_FILE` and the chained inputs in its dir are
absolute paths, and the kernel checks every directory on such a path: one directory above the
work root that others may not traverse (`/root` is mode 0700, and so is pytest's tmp dir) and
the job cannot open its own status file, though its relative paths work. That is what broke
the status file and chaining for a clone in `/root`.

`blocker()` finds such a directory, `choose()` picks a work root a job can reach (`scripts/up`
and the test stacks use it), and the worker refuses to start confined on a work root that a job
could not reach (`services/worker/main.py`), saying which directory blocks it and what to do.
"""

import os
import stat
import sys
from pathlib import Path


def blocker(work_root: Path) -> Path | None:
    """The first directory from `/` down to `work_root` (those that exist) that a uid other than
    its owner may not traverse (no `o+x`), or None when a job's uid can reach the work root."""
    path = Path(os.path.abspath(work_root))
    for directory in (*reversed(path.parents), path):
        try:
            mode = directory.stat().st_mode
        except FileNotFoundError:
            return None  # the worker makes the rest (mode 0755, then 0711)
        if not mode & stat.S_IXOTH:
            return directory
    return None


def unreachable(work_root: Path) -> str | None:
    """Why a confined job could not reach its work dir under `work_root` (None: it could), in
    words an operator can act on."""
    blocked = blocker(work_root)
    if blocked is None:
        return None
    mode = stat.S_IMODE(blocked.stat().st_mode)
    return (
        f"a confined job cannot reach its work dir under {work_root}: {blocked} is mode"
        f" {mode:04o}, which other users may not traverse (its status file and chained inputs"
        f" are absolute paths). Set VIGIL_WORK_ROOT to a directory every directory above which"
        f" others may traverse (scripts/up picks one), or allow it: chmod o+x {blocked}"
    )


def choose(preferred: Path, fallback: Path) -> Path:
    """`preferred` when a confined job could reach it (or jobs are not confined: this process
    is not root), else `fallback`."""
    if os.geteuid() != 0 or blocker(preferred) is None:
        return preferred
    return fallback


def main(argv: list[str]) -> int:
    """`python -m shared.host.work_root PREFERRED FALLBACK`: print the work root to use."""
    if len(argv) != 2:
        sys.stderr.write("usage: python -m shared.host.work_root PREFERRED FALLBACK\n")
        return 2
    sys.stdout.write(f"{choose(Path(argv[0]), Path(argv[1]))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
