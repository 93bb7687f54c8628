"""A job runs in a sealed room (design §6), under the default settings: what a plain user's job
could reach on its host beside the network (the host's Unix sockets, PostgreSQL's first among
them, other users' files and processes, the host's temporary dirs) is out of its sight, and it
writes nowhere but its work dir."""

import asyncio
import base64
import os
import uuid
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Events
from tests.e2e.stack import Stack
from tests.security.jobs import job_lines

pytestmark = pytest.mark.e2e

PG_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")

#: Connects to a Unix socket by its path, as any program of the job could (psql included).
CONNECT = (
    "python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])'"
    ' "$1" 2>/dev/null && echo reached || echo refused'
)


def _unique() -> str:
    return f"vigil-sealed-{uuid.uuid4().hex[:12]}"


async def test_postgresqls_socket_is_not_in_a_jobs_sight(
    plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    assert await _exists(PG_SOCKET), f"the test's PostgreSQL listens on {PG_SOCKET}"
    probe = (
        f"connect() {{ {CONNECT}; }}\n"
        f"connect {PG_SOCKET}\n"
        "psql -h /var/run/postgresql -U postgres -d test -c 'select 1' >/dev/null 2>&1"
        " && echo psql reached || echo psql refused\n"
        f"test -e {PG_SOCKET} && echo seen || echo unseen\n"
    )

    lines = await job_lines(plain_user[1], events, {"command": probe})

    assert lines == ["refused", "psql refused", "unseen"]


async def test_no_socket_of_the_host_is_in_a_jobs_sight(
    plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    probe = (
        'echo "run: $(find /run /var/run/ -type s 2>/dev/null | wc -l)"\n'
        "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null\n"
        "echo done"
    )

    lines = await job_lines(plain_user[1], events, {"command": probe})

    assert lines == ["run: 0", "done"]


async def test_another_users_tmp_files_and_work_dirs_are_not_in_a_jobs_sight(
    stack: Stack,
    client: httpx.AsyncClient,
    plain_user: tuple[str, httpx.AsyncClient],
    events: Events,
) -> None:
    name = _unique()
    [theirs] = await job_lines(
        plain_user[1], events, {"command": f'echo secret > /tmp/{name}; echo "$PWD"'}
    )
    probe = (
        f"test -e /tmp/{name} && echo tmp seen || echo tmp unseen\n"
        f"test -e {theirs} && echo work dir seen || echo work dir unseen\n"
        f'ls {stack.work_root} 2>/dev/null | grep -qv "^$(basename "$(dirname "$PWD")")$"'
        " && echo other jobs seen || echo other jobs unseen"
    )

    lines = await job_lines(client, events, {"command": probe})

    assert lines == ["tmp unseen", "work dir unseen", "other jobs unseen"]
    assert not await _exists(Path(f"/tmp/{name}"))  # nor left on the host


async def test_a_file_left_in_dev_shm_is_gone_with_its_task(
    plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    name = _unique()
    _, theirs = plain_user

    await job_lines(theirs, events, {"command": f"echo left > /dev/shm/{name}"})
    lines = await job_lines(
        theirs, events, {"command": f"test -e /dev/shm/{name} && echo seen || echo gone"}
    )

    assert lines == ["gone"]
    assert not await _exists(Path(f"/dev/shm/{name}"))


async def test_other_users_processes_are_not_in_a_jobs_sight(
    client: httpx.AsyncClient, plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    marker = _unique()
    answer = await client.post("/jobs", json={"command": f"exec -a {marker} sleep 120"})
    assert answer.status_code == 201, answer.text
    running = answer.json()["id"]
    try:
        await _on_the_host(marker, True)
        probe = (  # a process whose first word is the marker: the other user's, nothing else
            f"ps -eo args= | awk -v m={marker} '$1 == m' | wc -l\n"
            "ps -eo comm= | sort -u | tr '\\n' ' '"
        )

        lines = await job_lines(plain_user[1], events, {"command": probe})
    finally:
        cancelled = await client.post(f"/jobs/{running}/actions", json={"action": "cancel"})

    assert lines[0] == "0"
    assert set(lines[1].split()) <= {"vigil-init", "bash", "ps", "sort", "tr", "awk", "wc"}
    assert cancelled.json()["state"] == "cancelled"
    await _on_the_host(marker, False)  # the room ended with its job


async def test_a_job_writes_nowhere_but_its_work_dir(
    stack: Stack, plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    name = _unique()
    script = "#!/bin/bash\necho mine\n"
    files = {"run.sh": {"content": base64.b64encode(script.encode()).decode(), "executable": True}}
    probe = (
        f'try() {{ if touch "$1" 2>/dev/null; then echo "wrote $1"; else echo refused; fi; }}\n'
        f"try /etc/{name}\n"
        f"try {stack.work_root}/{name}\n"
        f'try "$(dirname "$PWD")/{name}"\n'
        f'try "$(dirname "$PWD")/.files/{name}"\n'
        f"try /var/tmp/{name} >/dev/null\n"
        f"try /usr/{name}\n"
        "./run.sh"
    )

    lines = await job_lines(plain_user[1], events, {"command": probe, "files": files})

    assert lines == ["refused"] * 5 + ["mine"]
    assert not await _exists(Path(f"/var/tmp/{name}"))  # its /var/tmp was its own


async def _exists(path: Path) -> bool:
    """Whether `path` is on the host (seen from the test, unconfined)."""
    return await asyncio.to_thread(path.exists)


async def _on_the_host(marker: str, running: bool, within: float = 20.0) -> None:
    """Once a process whose command line starts with `marker` runs on the host (`running`), or
    once none does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if await asyncio.to_thread(_has_process, marker) == running:
            return
        await asyncio.sleep(0.05)  # no event says a process was made, or ended
    pytest.fail(f"process {marker} {'never ran' if running else 'still runs'} after {within} s")


def _has_process(marker: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read().startswith(marker.encode()):
                    return True
        except OSError:
            continue
    return False
