"""The real one-node Slurm of `scripts/slurm`, for the tests of pilots and of the
Slurm client: `slurm_conf` brings it up once a session (it stays up afterwards: `scripts/slurm
down` stops it) and gives its `slurm.conf`. Without Slurm's binaries the tests fail, saying how
to install them; they never skip."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What `scripts/slurm up` runs and what the tests call.
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """The `slurm.conf` of the Slurm that `scripts/slurm up` runs (started when it is not)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    missing = [name for name in SLURM_BINARIES if shutil.which(name, path=search) is None]
    if missing:
        pytest.fail(
            f"Slurm is not installed here (no {', '.join(missing)}): apt-get install slurm-wlm "
            "munge (scripts/test does it when run as root), then scripts/slurm up"
        )
    try:
        up = subprocess.run(
            [str(ROOT / "scripts" / "slurm"), "up"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NO_COLOR": "1"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail("scripts/slurm up did not finish within 120 s")
    if up.returncode != 0:
        pytest.fail(f"scripts/slurm up failed (exit {up.returncode}):\n{up.stdout}{up.stderr}")
    return str(Path(os.environ.get("VIGIL_SLURM_DIR", "/tmp/vigil-slurm")) / "slurm.conf")
