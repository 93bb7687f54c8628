"""A service names, at its start, each `VIGIL_*` variable of its environment that nothing in
Vigil reads, with the closest known name; the variables Vigil reads elsewhere pass quietly."""

import os
import re
import subprocess
import sys
from pathlib import Path

from services.settings_catalog import known_variables
from shared.runtime.settings_names import unknown_settings


def test_a_misspelled_setting_is_named_with_the_closest_known_one() -> None:
    environ = {
        "VIGIL_PILOTS_BAKEND": "slurm",
        "VIGIL_API_PORT": "8000",  # the api's, in the worker's environment too (scripts/up)
        "VIGIL_JOB_ID": "j-1",  # a job's own environment
        "VIGIL_TOKEN": "t",  # the CLI's
        "vigil_fence_timeout_s": "5",  # read whatever its case
        "VIGIL_ZZZZZZ": "1",
        "HOME": "/root",
    }

    assert unknown_settings(environ, known_variables()) == [
        "unknown setting VIGIL_PILOTS_BAKEND (did you mean VIGIL_PILOTS_BACKEND?)",
        "unknown setting VIGIL_ZZZZZZ",
    ]


def test_every_setting_of_every_service_is_known() -> None:
    assert {"VIGIL_RECONCILE_S", "VIGIL_API_PORT", "VIGIL_PILOT_DRAIN_S"} <= known_variables()


def test_a_service_warns_at_its_start() -> None:
    # The pilot stops at once outside a batch job: its start is all this needs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "SLURM_"))}
    env["VIGIL_WORKER_PREFECH"] = "2"
    run = subprocess.run(
        [sys.executable, "-m", "services.pilot"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert run.returncode == 2, run.stderr
    assert (
        "unknown setting VIGIL_WORKER_PREFECH (did you mean VIGIL_WORKER_PREFETCH?)" in run.stderr
    )


#: scripts/lib.sh's own shell variables: set by it, never read from the environment.
_SHELL_ONLY = {"VIGIL_ROOT", "VIGIL_RUN", "VIGIL_PY", "VIGIL_SERVICES"}
_READERS = ("services", "shared", "vigil", "bench", "scripts", "deploy", "docker-compose.yml")


def test_every_variable_the_code_names_is_known() -> None:
    root = Path(__file__).resolve().parents[2]
    files = [
        path
        for part in _READERS
        for path in ([root / part] if (root / part).is_file() else (root / part).rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]
    named: dict[str, str] = {}
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name in re.findall(r"\bVIGIL_[A-Z0-9_]*[A-Z0-9]\b", text):
            named.setdefault(name, str(path.relative_to(root)))
    unknown = {
        name: where
        for name, where in named.items()
        if name not in known_variables() and name not in _SHELL_ONLY
    }
    assert unknown == {}, (
        "declare each as a setting of a service's model, or list it in READ_ELSEWHERE "
        "(shared/runtime/settings_names.py), then run python -m services.settings_reference"
    )
