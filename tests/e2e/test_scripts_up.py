"""The README's first screen as a newcomer runs it: a fresh clone, `scripts/up`, the README's
runnable blocks from the clone's root, then `scripts/down`, which leaves no service running.

The clone is made with `git clone` of this checkout's HEAD. What departs from a newcomer's
run, each for a reason:

- `.venv` is a link to the venv running this test: a fresh `pip install` would cost minutes.
  The services still run the clone's code (`python -m services.<name>` from the clone's root
  finds the clone's packages first; checked below), and the shell's `vigil` does too
  (`PYTHONPATH`: the venv's editable install points at the checkout that built it);
- settings of its own (`VIGIL_NAMESPACE`, a database, free ports, its own uid-range claims):
  the suite's other stacks, and other installations, share this machine and its servers;
- `VIGIL_NO_HOST_CHANGES=1`: a test installs no package and remounts nothing.
"""

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.cluster import free_port
from tests import doc_examples
from tests.conftest import AMQP_URL, REDIS_URL, fresh_database, new_namespace
from tests.e2e.conftest import delete_namespace
from tests.e2e.test_docs import Shell, _run_block

pytestmark = pytest.mark.e2e

CHECKOUT = doc_examples.ROOT
VENV = Path(sys.prefix)
#: scripts/up's own bound is the demo job's 60 s; the rest takes seconds.
UP_TIMEOUT_S = 180
DOWN_TIMEOUT_S = 60


def _clone(where: Path) -> Path:
    """`git clone` of the checkout, at its HEAD (detached or not, in a worktree or not)."""
    clone = where / "vigil"
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True, check=True
    ).stdout.strip()
    for git in (
        ["git", "clone", "--quiet", "--no-hardlinks", "--no-checkout", str(CHECKOUT), str(clone)],
        ["git", "-C", str(clone), "checkout", "--quiet", "--detach", head],
    ):
        subprocess.run(git, check=True, capture_output=True, timeout=120)
    # the venv is installed for this pyproject.toml and requirements.lock (scripts/test and
    # .ci/run make sure of it): the clone's keep the checkout's times, so scripts/up finds the
    # venv up to date and never installs into the venv it shares
    stamp = VENV / ".vigil-install-stamp"
    for name in ("pyproject.toml", "requirements.lock"):
        kept = (CHECKOUT / name).stat()
        assert stamp.exists() and stamp.stat().st_mtime > kept.st_mtime, (
            f"{VENV} is not installed for {CHECKOUT / name}: run scripts/test (or"
            " `source scripts/lib.sh && vigil_ensure_venv`) first"
        )
        os.utime(clone / name, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    (clone / ".venv").symlink_to(VENV)
    return clone


def _settings(clone: Path) -> dict[str, str]:
    """The settings scripts/up started the services with (`.run/settings`)."""
    lines = (clone / ".run" / "settings").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _service_processes(clone: Path) -> list[psutil.Process]:
    """Each service's keeper (its pid file) and everything it runs."""
    found = []
    for name in ("api", "scheduler", "worker", "supervisor"):
        keeper = psutil.Process(int((clone / ".run" / f"{name}.pid").read_text()))
        found += [keeper, *keeper.children(recursive=True)]
    return found


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[Path]:
    """A fresh clone; on exit, what scripts/up made outside it is removed."""
    made = _clone(tmp_path)
    try:
        yield made
    finally:
        if (made / ".run" / "settings").exists():
            work_root = Path(_settings(made)["VIGIL_WORK_ROOT"])
            if not work_root.is_relative_to(made):
                shutil.rmtree(work_root.parent, ignore_errors=True)
        for log in sorted((made / ".run" / "logs").glob("*.log")):
            print(f"----- {log.name} -----\n{log.read_text(errors='replace')[-4000:]}")  # noqa: T201


def test_a_fresh_clone_comes_up_runs_the_readme_and_goes_down(clone: Path, tmp_path: Path) -> None:
    namespace = new_namespace("up-", 10)
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("VIGIL_", "XDG_"))}
    # a newcomer's PATH: without this venv's bin, which scripts/test puts first
    path = kept.get("PATH", "").split(os.pathsep)
    kept["PATH"] = os.pathsep.join(d for d in path if Path(d) != VENV / "bin")
    kept.pop("VIRTUAL_ENV", None)
    home = tmp_path / "home"
    home.mkdir()
    with fresh_database("vigil_up") as database_url:
        api_port = free_port()
        env = kept | {
            "HOME": str(home),
            "VIGIL_NO_HOST_CHANGES": "1",
            "VIGIL_NAMESPACE": namespace,
            "VIGIL_DATABASE_URL": database_url,
            "VIGIL_AMQP_URL": AMQP_URL,
            "VIGIL_REDIS_URL": REDIS_URL,
            "VIGIL_API_PORT": str(api_port),
            "VIGIL_SCHEDULER_HEALTH_PORT": str(free_port()),
            "VIGIL_WORKER_HEALTH_PORT": str(free_port()),
            "VIGIL_SUPERVISOR_HEALTH_PORT": str(free_port()),
            "VIGIL_UID_RANGES_DIR": str(tmp_path / "uid-ranges"),
        }
        services: list[psutil.Process] = []
        try:
            # given: scripts/up, as the README's first block says
            up = subprocess.run(
                ["scripts/up"], cwd=clone, env=env, capture_output=True, text=True,
                timeout=UP_TIMEOUT_S,
            )  # fmt: skip
            assert up.returncode == 0, up.stdout + up.stderr
            assert "Vigil is up. Stop it with: scripts/down" in up.stdout, up.stdout
            services = _service_processes(clone)
            pythons = [p for p in services if p.name().startswith("python")]
            assert len(pythons) == 4, [p.cmdline() for p in services]  # each under its keeper
            assert {Path(p.cwd()) for p in pythons} == {clone}
            where = "import services; print(services.__file__)"
            imported = subprocess.run(
                [str(clone / ".venv" / "bin" / "python"), "-c", where],
                cwd=clone, capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert Path(imported.stdout.strip()).is_relative_to(clone), imported.stdout

            # when: the README's runnable blocks, from the clone's root, in a newcomer's shell
            user_env = kept | {"HOME": str(home), "PYTHONPATH": str(clone)}
            shell = Shell(clone, user_env)
            try:
                for block in doc_examples.blocks(clone / "README.md"):
                    _run_block(shell, block, f"http://127.0.0.1:{api_port}")
            finally:
                shell.close()

            # then: the campaign's results, as its fix made them, harvested into the clone
            harvested = sorted(p.read_text() for p in clone.glob("t-*.txt"))
            inputs = ["alpha", "beta", "delta", "epsilon", "gamma", "zeta"]
            assert harvested == [f"fixed result of {i}\n" for i in inputs], harvested

            # and scripts/down stops every service process, keepers included
            down = subprocess.run(
                ["scripts/down"], cwd=clone, env=env, capture_output=True, text=True,
                timeout=DOWN_TIMEOUT_S,
            )  # fmt: skip
            assert down.returncode == 0, down.stdout + down.stderr
            _gone, alive = psutil.wait_procs(services, timeout=5)
            assert alive == [], [p.cmdline() for p in alive]
            assert not list((clone / ".run").glob("*.pid"))
        finally:
            subprocess.run(
                ["scripts/down"], cwd=clone, capture_output=True, timeout=DOWN_TIMEOUT_S,
                check=False,
            )  # fmt: skip
            for left in services:  # what a failed scripts/down left: not for the next tests
                with contextlib.suppress(psutil.NoSuchProcess):
                    left.kill()
            asyncio.run(delete_namespace(namespace))
