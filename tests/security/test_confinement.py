"""On a worker running as root, a job runs as an unprivileged uid of its owner's own, in a network
namespace with nothing up, in a work dir only that uid can enter."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from shared.store import users_repo
from tests.e2e.conftest import Events, running_stack
from tests.e2e.stack import E2E_ENV, Stack
from tests.security.jobs import job_lines

pytestmark = pytest.mark.e2e

BASE = 2_000_000

PROBE = """
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
awk '/^(Groups|CapEff|NoNewPrivs):/ {print $1 $2}' /proc/self/status
echo "workdir=$(stat -c '%a %u' "$VIGIL_WORKDIR")"
touch made; echo "made=$(stat -c '%a' made)"
for port in 5432 5672 6379; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "port $port open"
  else echo "port $port closed"; fi
done
if cat "/proc/$PPID/environ" >/dev/null 2>&1; then echo "worker env readable"
else echo "worker env hidden"; fi
if touch "$(dirname "$(dirname "$VIGIL_WORKDIR")")/planted" 2>/dev/null; then
  echo "work root writable"; else echo "work root closed"; fi
"""


@pytest.fixture
def stack(e2e_namespace: str) -> Iterator[Stack]:
    if shutil.which("bwrap") is None or shutil.which("nsenter") is None:
        pytest.fail("bwrap and nsenter are needed: apt-get install bubblewrap util-linux")
    # The path to the work root must be traversable by the jobs' uids (pytest's own tmp dir
    # is private to root).
    root = Path(tempfile.mkdtemp(prefix="vigil-confined-", dir="/tmp"))
    root.chmod(0o711)
    env = {**E2E_ENV, "VIGIL_JOB_ISOLATION": "on", "VIGIL_JOB_UID_BASE": str(BASE)}
    try:
        with running_stack(root, e2e_namespace, env) as s:
            yield s
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _job_uid_of(stack: Stack, user_id: str) -> int:
    conn = await asyncpg.connect(stack.database_url)
    try:
        return BASE + await users_repo.job_uid(conn, user_id)
    finally:
        await conn.close()


async def test_a_job_runs_as_its_owners_uid_without_network_or_the_workers_secrets(
    stack: Stack, plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    user_id, client = plain_user
    uid = await _job_uid_of(stack, user_id)

    lines = await job_lines(client, events, {"command": PROBE})

    assert lines == [
        f"uid={uid} gid={uid} groups={uid}",
        "Groups:",  # no supplementary group
        "CapEff:0000000000000000",  # no capability
        "NoNewPrivs:1",  # and no way to gain any (a setuid program runs as the job)
        f"workdir=700 {uid}",
        "made=600",
        "port 5432 closed",
        "port 5672 closed",
        "port 6379 closed",
        "worker env hidden",
        "work root closed",
    ]


async def test_one_users_job_cannot_read_another_users_work_dir(
    stack: Stack,
    client: httpx.AsyncClient,
    plain_user: tuple[str, httpx.AsyncClient],
    events: Events,
) -> None:
    _, theirs = plain_user
    [where] = await job_lines(theirs, events, {"command": 'echo secret > s; echo "$PWD/s"'})

    lines = await job_lines(
        client, events, {"command": f"cat {where} 2>/dev/null || echo refused; echo done"}
    )

    assert lines == ["refused", "done"]


async def test_the_hosts_network_is_for_operators_only(
    client: httpx.AsyncClient, plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    probe = "(exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null && echo open || echo closed"
    body = {"command": probe, "policy": {"network": "host"}}

    refused = await plain_user[1].post("/jobs", json=body)
    lines = await job_lines(client, events, body)  # the stack's operator

    assert refused.status_code == 403
    assert "only an operator" in refused.json()["detail"]
    assert lines == ["open"]


async def test_an_owners_jobs_share_a_network_of_their_own_and_anothers_are_in_another(
    client: httpx.AsyncClient, plain_user: tuple[str, httpx.AsyncClient], events: Events
) -> None:
    _, theirs = plain_user
    probe = {"command": "readlink /proc/self/ns/net"}

    [mine], [mine_again], [their] = [
        await job_lines(owner, events, probe) for owner in (client, client, theirs)
    ]

    assert mine == mine_again  # made once for the owner, entered by each of their commands
    assert their != mine
    assert os.readlink("/proc/self/ns/net") not in (mine, their)  # neither is the host's
