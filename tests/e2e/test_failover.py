"""Failovers on a whole cluster on this machine: three RabbitMQ nodes, a
PostgreSQL primary with its synchronous standby, two apis, two schedulers and two hosts
(`bench.local_cluster`), one fault per test during a restartable job (`bench.failover`).

Each test asserts what the scenario must keep: every task completed, no input ran twice, every
event the database holds was received and none it does not hold. The figures (how fast) are
the benchmark's to print (`python -m bench.failover`, docs/explanation/scale-out.md), not
asserted here.
"""

import uuid
from pathlib import Path

import pytest

from bench.failover import SCENARIOS, run
from bench.local_cluster import STATE_FILE, LocalCluster
from tests.conftest import REDIS_URL, new_namespace, require_servers

pytestmark = pytest.mark.e2e

#: Ports of their own (and the RabbitMQ nodes' distribution ports, 20000 above), apart from
#: `scripts/cluster`'s, so that a cluster a developer has up does not clash with the tests'.
BASE_PORT = 6710
_ROOT_PREFIX = "vigil-failover-"


@pytest.fixture(scope="module", autouse=True)
def _no_cluster_left_over() -> None:
    """A run cut off (a timeout, ^C) leaves its cluster up on these ports and node names: take
    it down before starting another."""
    for state in Path("/tmp").glob(f"{_ROOT_PREFIX}*/{STATE_FILE}"):
        LocalCluster.load(state.parent).down()


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_a_fault_loses_nothing_and_runs_nothing_twice(scenario: str) -> None:
    require_servers()
    cluster = LocalCluster(
        Path("/tmp") / f"{_ROOT_PREFIX}{uuid.uuid4().hex[:8]}",
        hosts=2,
        slots=4,
        base_port=BASE_PORT,
        redis_url=REDIS_URL,
        namespace=new_namespace("fo-", 8),
    )
    report = await run(scenario, tasks=48, sleep_s=0.5, cluster=cluster)

    assert report.problems == [], f"{report}"  # a string: shown whole, not cut short
    assert report.figures["tasks by state"] == {"completed": 48}
    assert report.figures["inputs run twice"] == 0
    if scenario == "scheduler":
        assert "standby leads after (s)" in report.figures
    if scenario == "api":
        assert report.figures["submitted after the kill"].startswith("j-")
