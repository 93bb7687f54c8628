"""Fair share as an operator sets it and users see it: two users with shares 3 : 1, both with a
backlog on one host of 4 CPUs, get its task starts 75 / 25.

The shares are set with the installed `vigil` (`vigil users share`), the jobs submitted over
HTTP with each user's own token, and the split counted from what each user sees of their job
(`GET /jobs/{id}/tasks`: the tasks that started). The host is drained while both submit, and
undrained once both wait: the first round shares the whole host out by the shares, and from
then on every end is refilled by the user the policy serves first. With equal tasks, 3 : 1
held means 3 : 1 started, give or take the tasks running at the end: about 1 of B's 12.
"""

import asyncio
import subprocess
import uuid
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import HOST_ID, VIGIL
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

#: Tasks started, both users together, before the count: 12 of the 4 slots' turns.
STARTS = 48
#: Long enough that no user's commands count as short (staging ahead is for short ones).
TASK = "sleep 0.7"


def _vigil(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(VIGIL), *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, f"vigil {' '.join(args)}: {done.stderr}"
    return done.stdout


async def _started(user: httpx.AsyncClient, job_id: str) -> int:
    """How many of the job's tasks started, as its owner sees them."""
    response = await user.get(f"/jobs/{job_id}/tasks")
    response.raise_for_status()
    return sum(task["started_at"] is not None for task in response.json())


async def _counts(user: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await user.get(f"/jobs/{job_id}")
    response.raise_for_status()
    return dict(response.json()["counts"])


async def test_users_of_shares_3_and_1_with_backlogs_start_75_and_25_percent_of_the_tasks(
    stack: Stack, env: dict[str, str]
) -> None:
    # given: two users, the operator giving the first a share of 3, and the host drained
    tag = uuid.uuid4().hex[:6]
    names = [f"heavy-{tag}", f"light-{tag}"]
    tokens = [_vigil(env, "add-user", name).strip() for name in names]
    assert _vigil(env, "users", "share", names[0], "3").strip() == f"user {names[0]}: share 3"
    _vigil(env, "hosts", "drain", HOST_ID)
    users = [
        httpx.AsyncClient(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {t}"}, timeout=10
        )
        for t in tokens
    ]
    try:
        # when: each submits more than the host runs meanwhile, and the host takes work again
        body = {"command": TASK, "inputs": [str(n) for n in range(2 * STARTS)]}
        jobs = []
        for user in users:
            response = await user.post("/jobs", json=body)
            assert response.status_code == 201, response.text
            jobs.append(response.json()["id"])
        _vigil(env, "hosts", "undrain", HOST_ID)
        async with asyncio.timeout(60):
            while True:
                counts = [await _counts(u, j) for u, j in zip(users, jobs, strict=True)]
                if sum(c.get("completed", 0) for c in counts) >= STARTS - 4:
                    break
                await asyncio.sleep(0.2)  # polling the API, as `vigil status` does
        for user, job_id in zip(users, jobs, strict=True):
            cancel = await user.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})
            assert cancel.status_code in (200, 202), cancel.text

        # then: both still had tasks waiting, and the starts split 75 / 25 (± 5 points)
        assert all(c.get("new", 0) > 0 for c in counts), counts
        started = [await _started(u, j) for u, j in zip(users, jobs, strict=True)]
        heavy = 100 * started[0] / sum(started)
        print(f"starts {started}: {heavy:.1f} % for the share of 3")  # noqa: T201
        assert 70 <= heavy <= 80, f"starts {started}: {heavy:.1f} % for the share of 3"
    finally:
        for user in users:
            await user.aclose()
