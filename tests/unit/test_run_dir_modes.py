"""The run dir (`.run`: the operator token, the services' pid files and logs) is not readable by
other users, whatever the umask the scripts were started with (`scripts/lib.sh`,
`scripts/keeper`)."""

import stat
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _lib(run: Path, call: str) -> None:
    """`call` in bash, with scripts/lib.sh sourced, `run` as the run dir and umask 000."""
    script = f'source "{SCRIPTS}/lib.sh"; VIGIL_RUN="$1"; umask 000; {call}'
    subprocess.run(["bash", "-c", script, "bash", str(run)], check=True, timeout=30)


def test_the_run_dir_and_its_files_are_made_private(tmp_path: Path) -> None:
    run = tmp_path / ".run"
    (run / "logs").mkdir(parents=True, mode=0o755)
    run.chmod(0o755)
    for name in ("token", "api.pid", "logs/api.log", "logs/pip.log"):
        (run / name).write_text("x")
        (run / name).chmod(0o644)

    _lib(run, 'vigil_private_run; vigil_private_file "$VIGIL_RUN/logs/worker.log"')

    assert _mode(run) == 0o711  # traversable: the work root may be .run/work
    assert _mode(run / "logs") == 0o700
    for name in ("token", "api.pid", "logs/api.log", "logs/pip.log", "logs/worker.log"):
        assert _mode(run / name) == 0o600, name


def test_a_fresh_run_dir_is_made_private(tmp_path: Path) -> None:
    run = tmp_path / ".run"

    _lib(run, "vigil_private_run")

    assert (_mode(run), _mode(run / "logs")) == (0o711, 0o700)


def test_the_keeper_writes_its_pid_file_for_the_operator_alone(tmp_path: Path) -> None:
    pidfile = tmp_path / "svc.pid"

    subprocess.run(
        ["bash", "-c", 'umask 000; exec "$0" "$1" true', str(SCRIPTS / "keeper"), str(pidfile)],
        check=True,
        timeout=30,
    )

    assert pidfile.read_text().strip().isdigit()
    assert _mode(pidfile) == 0o600
