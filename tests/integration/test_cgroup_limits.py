"""A task's limits are the kernel's (real cgroups of this host, real processes): a command that
goes over its memory limit is killed and told apart by its cgroup's own counts; one that
forks past its process limit sees its forks fail; a command with no limit is not bothered."""

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.worker import process
from shared.host.cgroups import Cgroups, TaskLimits
from tests.conftest import unavailable

pytestmark = pytest.mark.integration

#: Holds about 256 MiB at once (a shell pipe would stream it).
HOG = "python3 -c 'x = bytearray(256 * 2**20); print(len(x))'"
#: Forks up to 40 children that sleep (a refused fork fails at once in Python, where bash
#: would retry for seconds), says how many it got, and ends them.
FORKER = """python3 - <<'PY'
import os, signal, time
children = []
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
print(len(children))
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
PY"""


def limiting(*controllers: str) -> Iterator[Cgroups]:
    """This host's cgroups for a test's tasks, if they can limit with `controllers` (else the
    test cannot run: `unavailable`); removed after it (every test waits for its tasks' cgroups
    to go)."""
    found = Cgroups.detect(f"limits-{uuid.uuid4().hex[:8]}")
    if found is None or not set(controllers) <= found.limitable:
        unavailable(
            f"this kernel gives no usable {' and '.join(controllers)} cgroup controllers to"
            " root here (not installable: run on a host with cgroups, as CI's machine has)"
        )
    yield found
    for path in (found.root, *(root for _, root in found.v1_roots)):
        path.rmdir()


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    yield from limiting("memory", "pids")


async def _run(
    cgroups: Cgroups, script: str, limits: TaskLimits, workdir: Path
) -> tuple[int, str, str]:
    task_id, claim = f"t-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    cgroup = cgroups.create(task_id, claim, limits)
    assert cgroup is not None
    running = await process.spawn(
        script, workdir, {}, cgroup, limiters=cgroups.limiter_paths(task_id, claim)
    )
    await running.join_cgroup()
    assert running.cgroup is not None, "the command did not join its cgroups"
    running.open_gate()
    lines: list[str] = []

    async def noted(_returncode: int) -> None:
        return None

    returncode = await asyncio.wait_for(
        process.wait(running, lambda _name, line: lines.append(line), noted), 60
    )
    over = cgroups.over_memory(task_id, claim)
    async with asyncio.timeout(10):  # the killed stragglers leave their cgroups
        while cgroup.exists() or any(p.exists() for p in cgroups.limiter_paths(task_id, claim)):
            cgroups.remove(task_id, claim)
            await asyncio.sleep(0.01)
    return returncode, f"over_memory={over}", "\n".join(lines)


async def test_a_command_over_its_memory_limit_is_killed_and_counted_as_such(
    cgroups: Cgroups, tmp_path: Path
) -> None:
    returncode, over, _ = await _run(cgroups, HOG, TaskLimits(memory_bytes=64 * 2**20), tmp_path)

    assert (returncode, over) == (-9, "over_memory=True")


async def test_the_same_command_within_its_limit_runs_and_no_kill_is_counted(
    cgroups: Cgroups, tmp_path: Path
) -> None:
    returncode, over, out = await _run(
        cgroups, HOG, TaskLimits(memory_bytes=1024 * 2**20), tmp_path
    )

    assert (returncode, over, out) == (0, "over_memory=False", str(256 * 2**20))


async def test_a_command_that_forks_past_its_process_limit_sees_its_forks_fail(
    cgroups: Cgroups, tmp_path: Path
) -> None:
    script = FORKER
    returncode, _, out = await _run(cgroups, script, TaskLimits(pids=16), tmp_path)

    assert returncode == 0
    assert 0 < int(out) < 16  # bash and python are two of the 16
