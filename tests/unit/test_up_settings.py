"""scripts/up never starts services with other settings than those already running: what it
compares (`vigil_settings`, `vigil_settings_changed` in `scripts/lib.sh`)."""

import os
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _lib(call: str, env: dict[str, str], *args: str) -> str:
    """What `call` prints in bash with scripts/lib.sh sourced, in `env` alone (and PATH)."""
    script = f'source "{SCRIPTS}/lib.sh"; {call}'
    done = subprocess.run(
        ["bash", "-c", script, "bash", *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def test_the_settings_are_every_vigil_variable_sorted_the_token_by_its_digest_only() -> None:
    env = {"VIGIL_PILOTS_BACKEND": "slurm", "VIGIL_BOOTSTRAP_TOKEN": "s3cret", "OTHER": "x"}

    lines = _lib("vigil_settings", env).splitlines()

    settings = dict(line.split("=", 1) for line in lines if line.startswith("VIGIL_"))
    assert settings["VIGIL_PILOTS_BACKEND"] == "slurm"
    assert settings["VIGIL_BOOTSTRAP_TOKEN"].startswith("sha256:")
    assert "s3cret" not in "".join(lines) and "OTHER" not in "".join(lines)
    assert lines == sorted(lines)


def test_the_settings_that_changed_are_named_once_each(tmp_path: Path) -> None:
    before, now = tmp_path / "before", tmp_path / "now"
    before.write_text("VIGIL_A=1\nVIGIL_B=2\nVIGIL_GONE=x\n")
    now.write_text("VIGIL_A=1\nVIGIL_B=3\nVIGIL_NEW=y\n")

    changed = _lib('vigil_settings_changed "$1" "$2"', {}, str(before), str(now))

    assert changed.split() == ["VIGIL_B", "VIGIL_GONE", "VIGIL_NEW"]
    assert _lib('vigil_settings_changed "$1" "$1"', {}, str(before)) == ""
