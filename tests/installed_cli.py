"""The installed `vigil` command (`pip install -e .` puts it beside the venv's python), run as a
user's shell runs it: a subprocess, with the caller's environment but no `VIGIL_*` or `XDG_*`
setting of the test's own (only those the test passes), so a test sees what a user sees."""

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

VIGIL: Final = Path(sys.executable).with_name("vigil")


@dataclass(frozen=True)
class Ran:
    """What one run of the command did."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Both streams, for an assertion's message."""
        return self.stdout + self.stderr


def user_environment(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without its `VIGIL_*`/`XDG_*` settings, plus `settings`."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "XDG_"))}
    return kept | dict(settings)


def run_vigil(
    args: list[str], settings: Mapping[str, str], input: str | None = None, timeout: float = 60
) -> Ran:
    """`vigil args...` to its end, with `settings` (`VIGIL_URL`, `VIGIL_TOKEN`...) and `input`
    on its stdin (none: an empty one)."""
    assert VIGIL.exists(), f"{VIGIL} is missing: pip install -e . installs the command"
    done = subprocess.run(
        [str(VIGIL), *args],
        env=user_environment(settings),
        input=input or "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Ran(done.returncode, done.stdout, done.stderr)
