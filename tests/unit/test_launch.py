"""Where a task's command runs (`services/worker/launch.py`): the launcher is chosen once from
the worker's settings (`VIGIL_JOB_ISOLATION`), an unprivileged worker runs commands as itself
only when told or allowed to, and the local launchers start, stop and clean up a command."""

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from services.worker import confinement, launch
from services.worker.confinement import CannotConfine, Confinement, Sealer
from services.worker.launch import Command, LocalConfined, LocalUnconfined
from services.worker.settings import WorkerSettings
from shared.host.cgroups import Cgroups, TaskLimits
from shared.store.db import Pool


def _settings(work_root: Path, isolation: str | None = None) -> WorkerSettings:
    more: dict[str, Any] = {} if isolation is None else {"job_isolation": isolation}
    return WorkerSettings(host_id="h-1", work_root=str(work_root), **more)


def _command(workdir: Path, owner: str = "u-1") -> Command:
    return Command("t-1", uuid.uuid4(), owner, workdir, "none", TaskLimits())


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker started by an unprivileged user (a pilot in a batch allocation)."""
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(confinement, "_tried", lambda _held: pytest.fail("nothing is tried"))


def test_isolation_off_runs_commands_unconfined_as_the_workers_own_user(
    tmp_path: Path, not_root: None
) -> None:
    chosen = launch.choose(_settings(tmp_path, "off"))

    launcher = chosen.launcher(cast(Pool, None), None)
    assert isinstance(launcher, LocalUnconfined)
    assert launcher.describe() == "unconfined: as the worker's own user (uid 1000), on its network"


def test_a_worker_that_is_not_root_refuses_to_start_when_told_to_confine(
    tmp_path: Path, not_root: None
) -> None:
    with pytest.raises(CannotConfine, match="VIGIL_JOB_ISOLATION=on, but the worker is not root"):
        launch.choose(_settings(tmp_path, "on"))


def test_a_worker_that_is_not_root_left_to_auto_runs_unconfined_and_says_so(
    tmp_path: Path, not_root: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)

    chosen = launch.choose(_settings(tmp_path))  # unset: auto

    assert chosen.confinement is None
    assert isinstance(chosen.launcher(cast(Pool, None), None), LocalUnconfined)
    assert "jobs run as the worker's own user, unconfined: the worker is not root" in caplog.text


def test_a_worker_that_can_confine_runs_commands_confined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reached: list[tuple[Confinement | None, Path]] = []
    monkeypatch.setattr(confinement, "decide", lambda _isolation, base, _sealed: Confinement(base))
    monkeypatch.setattr(confinement, "check_reach", lambda *seen: reached.append(seen))

    chosen = launch.choose(_settings(tmp_path, "on"))

    launcher = chosen.launcher(cast(Pool, None), None)
    assert isinstance(launcher, LocalConfined)
    assert launcher.work_root == tmp_path
    assert launcher.describe().startswith("confined: as uid 2000000 + their owner's number")
    assert reached == [(Confinement(2_000_000), tmp_path)]  # its jobs reach their work dirs


class _Users:
    """A pool whose only query is an owner's `job_uid`, counted."""

    def __init__(self, job_uid: int) -> None:
        self.job_uid, self.asked = job_uid, 0

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator["_Users"]:
        yield self

    async def fetchval(self, _query: str, _owner: str) -> int:
        self.asked += 1
        return self.job_uid


async def test_a_confined_command_starts_through_its_owners_uid_read_once_per_owner(
    tmp_path: Path,
) -> None:
    held = Confinement(2_000_000, {7: 42})
    users = _Users(7)
    launcher = LocalConfined(None, held, cast(Pool, users), tmp_path)

    first = await launcher.prepare(_command(tmp_path / "j" / "t"))
    again = await launcher.prepare(_command(tmp_path / "j" / "u"))

    assert isinstance(first.sealed, Sealer) and isinstance(again.sealed, Sealer)
    assert (first.sealed.job_uid, again.sealed.job_uid) == (7, 7)
    assert (first.sealed.room.workdir, again.sealed.room.workdir) == (
        tmp_path / "j" / "t",
        tmp_path / "j" / "u",
    )
    assert first.sealed(9) == held.argv(7, "none", first.sealed.room, 9)
    assert first.hand_over is not None and users.asked == 1


class _Cgroups:
    """The cgroups a launcher makes and removes, noted."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.removed: list[str] = []

    def create(self, task_id: str, _claim: uuid.UUID, _limits: TaskLimits) -> None:
        self.made.append(task_id)
        return None  # could not be made: the command runs without one

    def limiter_paths(self, _task_id: str, _claim: uuid.UUID) -> list[Path]:
        return []

    def remove(self, task_id: str, _claim: uuid.UUID) -> None:
        self.removed.append(task_id)


async def test_a_confined_command_that_cannot_be_made_ready_leaves_no_cgroup(
    tmp_path: Path,
) -> None:
    class _NoNetwork(Confinement):
        def network_of(self, job_uid: int) -> str:
            raise OSError("unshare(CLONE_NEWNET): operation not permitted")

    cgroups = _Cgroups()
    launcher = LocalConfined(
        cast(Cgroups, cgroups), _NoNetwork(2_000_000), cast(Pool, _Users(7)), tmp_path
    )

    with pytest.raises(OSError, match="CLONE_NEWNET"):
        await launcher.prepare(_command(tmp_path))

    assert cgroups.made == cgroups.removed == ["t-1"]


async def test_an_unconfined_command_runs_once_its_gate_opens_and_ends_cleaned_up(
    tmp_path: Path,
) -> None:
    cgroups = _Cgroups()
    prepared = await LocalUnconfined(cast(Cgroups, cgroups)).prepare(_command(tmp_path))
    lines: list[str] = []
    exits: list[int] = []

    async def noted(returncode: int) -> None:
        exits.append(returncode)

    running = await prepared.start('echo "as $(id -u)"; exit 3', tmp_path, {})
    await running.join_cgroup()
    running.open_gate()
    async with asyncio.timeout(10):
        returncode = await running.watch(lambda _name, line: lines.append(line), noted)

    assert (returncode, exits, running.returncode) == (3, [3], 3)
    assert lines == [f"as {os.getuid()}"]
    assert prepared.end(running) is False  # no memory counts to read: none over its limit
    assert cgroups.removed == ["t-1"]


async def test_a_command_stopped_at_its_gate_never_runs(tmp_path: Path) -> None:
    prepared = await LocalUnconfined(None).prepare(_command(tmp_path))

    running = await prepared.start(f'touch "{tmp_path / "ran"}"', tmp_path, {})
    running.stop()
    async with asyncio.timeout(10):
        await running.reaped()

    assert not (tmp_path / "ran").exists()
    assert running.returncode is not None and running.returncode != 0
    assert prepared.end() is False
