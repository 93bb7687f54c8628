"""A command is held at a gate until the worker has made its task `on_cpu` (real bash)."""

import asyncio
from pathlib import Path

import psutil
import pytest

from services.worker import process

SCRIPT = 'echo "$0 ran" > ran.txt; echo out'


async def _lines(running: process.Running) -> bytes:
    assert running.process.stdout is not None
    return await running.process.stdout.read()


def _waits_at_the_gate(pid: int) -> bool:
    """bash is asleep in its `read` of the gate: stdin is still the gate's pipe."""
    proc = psutil.Process(pid)
    stdin = Path(f"/proc/{pid}/fd/0").readlink()
    return proc.status() == psutil.STATUS_SLEEPING and str(stdin).startswith("pipe:")


async def test_the_script_runs_only_once_the_gate_is_opened(tmp_path: Path) -> None:
    running = await process.spawn(SCRIPT, tmp_path, {})

    async with asyncio.timeout(10):
        while not _waits_at_the_gate(running.pid):  # noqa: ASYNC110 (nothing to await)
            await asyncio.sleep(0.01)
    held = (tmp_path / "ran.txt").exists()
    running.open_gate()
    output, code = await _lines(running), await running.process.wait()

    assert not held
    assert (output, code) == (b"out\n", 0)
    assert (tmp_path / "ran.txt").read_text() == "bash ran\n"  # $0 as under plain bash -c


async def test_the_script_sees_neither_the_gate_nor_its_pipe(tmp_path: Path) -> None:
    script = 'echo "[${BASH_ENV-unset}]"; cat; echo "args=$#"'
    running = await process.spawn(script, tmp_path, {})

    running.open_gate()
    output, code = await _lines(running), await running.process.wait()

    assert (output, code) == (b"[unset]\nargs=0\n", 0)  # stdin is /dev/null: cat ends at once


async def test_a_closed_gate_ends_the_process_without_running_the_script(tmp_path: Path) -> None:
    running = await process.spawn(SCRIPT, tmp_path, {})

    running.close_gate()
    code = await running.process.wait()

    assert code == 125
    assert not (tmp_path / "ran.txt").exists()


async def test_what_prepares_the_work_dir_runs_before_the_process_and_its_failure_starts_none(
    tmp_path: Path,
) -> None:
    def prepare() -> None:
        (tmp_path / "ready").write_text("yes")

    def fail() -> None:
        raise PermissionError("cannot give the work dir away")

    running = await process.spawn("cat ready > seen.txt", tmp_path, {}, prepare=prepare)
    running.open_gate()
    assert await running.process.wait() == 0
    before = set(psutil.Process().children())
    with pytest.raises(PermissionError):
        await process.spawn(SCRIPT, tmp_path, {}, prepare=fail)

    assert (tmp_path / "seen.txt").read_text() == "yes"
    assert set(psutil.Process().children()) == before  # nothing was started
