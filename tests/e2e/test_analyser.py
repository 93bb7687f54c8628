"""A site's analyser on the real services: the example package of `examples/`,
installed with pip as a site would install its own, decides after a SIGSEGV."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Events, running_stack, wait_job
from tests.e2e.stack import E2E_ENV, Stack

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parents[2] / "examples" / "retry-segv"

# Segfaults until it is given a seed; prints the seed it got.
SEGV_UNTIL_SEEDED = 'test -n "$VIGIL_RESUME" || kill -SEGV $$; echo "resumed with $VIGIL_RESUME"'
ALWAYS_SEGV = "kill -SEGV $$"


def _site(root: Path) -> Path:
    """A directory for PYTHONPATH into which pip installed the example package (its module and
    the metadata that registers it), exactly as a site installs its own."""
    site = root / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(EXAMPLE)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    return site


@pytest.fixture
def stack(tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    env = E2E_ENV | {"PYTHONPATH": str(_site(tmp_path))}
    with running_stack(tmp_path, e2e_namespace, env) as s:
        yield s


async def _run(client: httpx.AsyncClient, events: Events, command: str) -> dict[str, Any]:
    body = {"command": command, "policy": {"analyser": "retry-segv"}}
    response = await client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    job = await wait_job(client, events, response.json()["id"])
    [task] = (await client.get(f"/jobs/{job['id']}/tasks")).json()
    detail = (await client.get(f"/tasks/{task['id']}")).json()
    return {"job": job, "task": detail}


def _cluster_attempts(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in task["attempts"] if a["stage"] == "cluster"]


async def test_a_segfault_is_retried_with_a_new_seed_by_the_sites_analyser(
    client: httpx.AsyncClient, events: Events
) -> None:
    assert (await client.get("/analysers")).json() == ["default", "retry-segv"]
    ran = await _run(client, events, SEGV_UNTIL_SEEDED)

    assert ran["job"]["state"] == "completed"
    first, second = _cluster_attempts(ran["task"])
    assert (first["signal"], first["decision"]) == (11, "recovered")
    assert first["decision_reason"].startswith("SIGSEGV 1/2: retried with seed ")
    seed = first["decision_reason"].rsplit(" ", 1)[-1]
    assert second["outcome"] == "data_ready"
    logs = (await client.get(f"/jobs/{ran['job']['id']}/logs")).json()["items"]
    assert [line["line"] for line in logs] == [f'resumed with {{"seed": {seed}}}']


async def test_the_sites_analyser_gives_up_after_two_retries_as_the_default_would(
    client: httpx.AsyncClient, events: Events
) -> None:
    ran = await _run(client, events, ALWAYS_SEGV)

    assert ran["job"]["state"] == "failed"
    assert (ran["task"]["state"], ran["task"]["failure_class"]) == ("failed_on_cluster", "signal")
    decisions = [a["decision"] for a in _cluster_attempts(ran["task"])]
    assert decisions == ["recovered", "recovered", "abandoned"]


async def test_an_analyser_the_api_does_not_know_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/jobs", json={"command": "true", "policy": {"analyser": "retry-sigbus"}}
    )

    assert response.status_code == 422
    assert "unknown analyser 'retry-sigbus'; installed: default, retry-segv" in response.text
