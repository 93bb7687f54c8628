"""No split brain on a partition. Two hosts, each reaching PostgreSQL,
RabbitMQ and Redis through a link of its own. The host running a restartable task is cut off:
the rest of the cluster declares it lost and runs a clone on the other host, and the cut-off
host's supervisor kills its own command first (self-fencing). The job's own effects file shows
the two executions never overlapped. Healed, the host rejoins and its stale report is refused.
"""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import AMQP_URL, REDIS_URL, fresh_database
from tests.e2e.conftest import Events, started, wait_job
from tests.e2e.links import Link, link_loop
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

HOSTS = ("h-left", "h-right")
FENCE_TIMEOUT_S = 6  # the cut-off host fences after 3 s; the clone may start after 6 s


@pytest.fixture
def links() -> Iterator[tuple[str, dict[str, Link]]]:
    with fresh_database("vigil_e2e") as url, link_loop() as loop:
        made = {
            host: Link(
                loop,
                {
                    "VIGIL_DATABASE_URL": url,
                    "VIGIL_AMQP_URL": AMQP_URL,
                    "VIGIL_REDIS_URL": REDIS_URL,
                },
            )
            for host in HOSTS
        }
        try:
            yield url, made
        finally:
            for link in made.values():
                link.close()


@pytest.fixture
def stack(
    tmp_path: Path, e2e_namespace: str, links: tuple[str, dict[str, Link]]
) -> Iterator[Stack]:
    url, made = links
    s = Stack(
        database_url=url,
        amqp_url=AMQP_URL,
        redis_url=REDIS_URL,
        namespace=e2e_namespace,
        root=tmp_path,
        hosts=list(HOSTS),
        extra_env={**E2E_ENV, "VIGIL_FENCE_TIMEOUT_S": str(FENCE_TIMEOUT_S)},
        host_env={host: link.urls for host, link in made.items()},
    )
    with started(s):
        yield s


def _effects(path: Path) -> dict[str, list[float]]:
    """The effects file's timestamps, by execution (`<host> <claim>`)."""
    runs: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        host, claim, stamp = line.split()
        runs.setdefault(f"{host} {claim}", []).append(float(stamp))
    return runs


async def test_a_host_cut_off_fences_itself_before_its_task_runs_elsewhere(
    stack: Stack,
    client: httpx.AsyncClient,
    events: Events,
    links: tuple[str, dict[str, Link]],
    shared_dir: Path,
) -> None:
    effects = shared_dir / "effects"
    # Every execution stamps the effects file every 50 ms; the first one runs until killed,
    # a later one (the clone) ends after 20 stamps.
    marker = shared_dir / "first"
    script = (
        'IFS=/ read -r _ host _ claim <<< "$VIGIL_MARK"; n=0; '
        f"if mkdir {marker} 2>/dev/null; then n=-1000000; fi; "
        f'while :; do echo "$host $claim $(date +%s.%N)" >> {effects}; n=$((n+1)); '
        "if [ $n -ge 20 ]; then exit 0; fi; sleep 0.05; done"
    )
    policy = {"restartable": True, "backoff": {"initial_s": 0.1, "max_s": 0.2}}
    body = {"command": script, "policy": policy}
    answer = await client.post("/jobs", json=body)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    started = await events.wait_key(f"task.on_cpu.{job_id}")
    cut_host = started["host"]

    links[1][cut_host].cut()
    job = await wait_job(client, events, job_id, within=60)
    links[1][cut_host].heal()

    assert job["state"] == "completed"
    runs = _effects(effects)
    assert len(runs) == 2, runs
    [first] = [stamps for run, stamps in runs.items() if run.startswith(f"{cut_host} ")]
    [clone] = [stamps for run, stamps in runs.items() if not run.startswith(f"{cut_host} ")]
    assert max(first) < min(clone), "the two executions overlapped"
    tasks = (await client.get(f"/jobs/{job_id}/tasks")).json()
    views = sorted((t["state"], t["failure_class"], t["host"]) for t in tasks)
    assert views[0][:2] == ("completed", None) and views[0][2] != cut_host
    assert views[1] == ("failed_on_cluster", "lost", cut_host)

    # Healed, the cut-off host rejoins: its supervisor's heartbeat is fresh again.
    async with asyncio.timeout(30):
        while True:
            hosts = {h["id"]: h for h in (await client.get("/hosts")).json()}
            age = hosts[cut_host]["supervisor_heartbeat_age_s"]
            if age is not None and age < 2:
                break
            await asyncio.sleep(0.2)
