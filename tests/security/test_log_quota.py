"""The log quota: one run stored 38 MiB of log lines in 3.6 s. A run now
keeps `VIGIL_LOG_QUOTA_BYTES` of lines; past it one marker line says so and the rest is not
kept, and the task goes on to its normal end."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Events, running_stack, wait_job
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

QUOTA = 2048


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    env = {**E2E_ENV, "VIGIL_LOG_QUOTA_BYTES": str(QUOTA)}
    with running_stack(tmp_path, e2e_namespace, env) as s:
        yield s


async def test_a_run_that_prints_past_its_quota_keeps_its_quota_and_says_so(
    client: httpx.AsyncClient, events: Events
) -> None:
    script = (
        "for i in $(seq 1 100); do printf 'line %03d %s\\n' $i $(printf 'x%.0s' $(seq 90)); done"
    )
    job_id = (await client.post("/jobs", json={"command": script})).json()["id"]

    assert (await wait_job(client, events, job_id))["state"] == "completed"

    items = (await client.get(f"/jobs/{job_id}/logs", params={"limit": 500})).json()["items"]
    lines = [item["line"] for item in items]
    assert lines[0].startswith("line 001 ")
    assert lines[-1].startswith("[vigil: log truncated: this run printed more than 2048 bytes")
    kept = lines[:-1]
    assert len(kept) == QUOTA // 100  # 100 bytes a line, newline included
    assert sum(len(line) + 1 for line in kept) <= QUOTA
