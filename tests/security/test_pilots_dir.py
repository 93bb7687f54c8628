"""The scheduler's pilots dir (`VIGIL_PILOTS_DIR`) is its own: made 0700, never through a link,
never a dir another user made first; by default in the scheduler's user's home, not `/tmp`."""

import os
import stat
from pathlib import Path
from typing import cast

import pytest

from services.scheduler.pilots import BatchSystem, PilotPool, PilotPoolSettings
from services.scheduler.settings import SchedulerSettings
from shared.host.private_dir import UnsafeDir
from shared.store.db import Pool
from tests.conftest import require_root

#: A uid that is not this process's (nobody's).
SOMEONE_ELSE = 65534


def _pool_on(workdir: Path) -> PilotPool:
    """A pilot pool whose batch jobs' files go to `workdir` (nothing submitted)."""
    settings = PilotPoolSettings(backend="slurm", worker_pool="p", workdir=str(workdir))
    return PilotPool(cast(Pool, None), cast(BatchSystem, None), settings)


def test_the_pilots_dir_is_made_private(tmp_path: Path) -> None:
    _pool_on(tmp_path / "pilots")

    seen = os.lstat(tmp_path / "pilots")
    assert stat.S_ISDIR(seen.st_mode) and stat.S_IMODE(seen.st_mode) == 0o700
    assert seen.st_uid == os.geteuid()


def test_a_pilots_dir_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "pilots").symlink_to(elsewhere)

    with pytest.raises(UnsafeDir, match="is a symbolic link"):
        _pool_on(tmp_path / "pilots")

    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755  # nothing done through the link


def test_a_pilots_dir_someone_else_made_is_refused(tmp_path: Path) -> None:
    require_root("giving a dir to another uid")
    planted = tmp_path / "pilots"
    planted.mkdir()
    os.chown(planted, SOMEONE_ELSE, SOMEONE_ELSE)

    with pytest.raises(UnsafeDir, match=f"belongs to uid {SOMEONE_ELSE}"):
        _pool_on(planted)


def test_a_pilots_dir_under_a_dir_anyone_may_replace_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, not sticky: anyone may rename what is in it

    with pytest.raises(UnsafeDir, match="writable by others"):
        _pool_on(shared / "pilots")

    assert not (shared / "pilots").exists()


def test_the_default_pilots_dir_is_the_schedulers_own_per_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VIGIL_PILOTS_DIR", raising=False)

    workdir = SchedulerSettings(namespace="ns1").pilots().workdir

    assert workdir == str(Path.home() / ".vigil" / "ns1" / "pilots")
    assert not workdir.startswith("/tmp")
