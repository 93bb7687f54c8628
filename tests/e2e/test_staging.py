"""Staging on the real services: a host may be handed work beyond its free capacity (set up
ahead, so that its next command is ready when one ends), and that never makes another user
wait behind it: the next capacity freed goes to the task fair share would choose then."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Events, running_stack, wait_job
from tests.e2e.stack import E2E_ENV, Stack
from tests.e2e.test_shared_pool import _submit, _user

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["short history", "worker prefetch"])
def stack(request: pytest.FixtureRequest, tmp_path: Path, e2e_namespace: str) -> Iterator[Stack]:
    """One host of 4 CPUs that stages work beyond its capacity: as users get it (for users
    whose commands ran short lately), or for every job (`VIGIL_WORKER_PREFETCH`)."""
    env = dict(E2E_ENV)
    if request.param == "worker prefetch":
        env["VIGIL_WORKER_PREFETCH"] = "4"
    with running_stack(tmp_path, e2e_namespace, env) as s:
        yield s


def _tasks_with(events: Events, state: str, job_id: str) -> list[tuple[int, str]]:
    """(position, task id) of each `task.<state>.<job>` event seen, in order."""
    key = f"task.{state}.{job_id}"
    return [(b["seq"], b["task_id"]) for k, b in events.received if k == key]


async def test_staged_work_never_makes_a_user_who_comes_later_wait_behind_it(
    stack: Stack, client: httpx.AsyncClient, events: Events
) -> None:
    alice = await _user(client, stack, "alice")
    bob = await _user(client, stack, "bob")
    async with alice, bob:
        # given Alice's commands ran short lately, then 12 tasks of hers of 6 s or more, staged
        # on the host beyond its 4 CPUs (set up before any of the first four ended); each lasts
        # 2 s longer than the one before, so that no two free their CPU at the same moment and
        # "the first capacity freed" is one CPU, whatever Bob's setup takes
        short = await _submit(alice, command="true", inputs=list("abcd"), name="short")
        assert (await wait_job(alice, events, short))["state"] == "completed"
        alice_job = await _submit(
            alice,
            command="sleep $((6 + 2 * VIGIL_INPUT))",
            inputs=[str(i) for i in range(12)],
            name="alice",
        )
        async with asyncio.timeout(20), events.changed:
            while len(_tasks_with(events, "on_cpu", alice_job)) < 4:
                await events.changed.wait()

        # when Bob submits one task
        bob_job = await _submit(bob, command="echo hi", inputs=["x"], name="bob")

        # then it runs at the first capacity freed, before any of Alice's staged tasks
        assert (await wait_job(bob, events, bob_job, within=30))["state"] == "completed"
        [(bob_started, _)] = _tasks_with(events, "on_cpu", bob_job)
        first_end = min(seq for seq, _ in _tasks_with(events, "completed", alice_job))
        set_up_early = {
            t for seq, t in _tasks_with(events, "setting_up", alice_job) if seq < first_end
        }
        assert len(set_up_early) > 4, "Alice's work was not staged: the scenario did not happen"
        alice_started = [seq for seq, _ in _tasks_with(events, "on_cpu", alice_job)]
        assert sum(seq < bob_started for seq in alice_started) == 4
    cancelled = await client.post(f"/jobs/{alice_job}/actions", json={"action": "cancel"})
    assert cancelled.status_code == 202, cancelled.text
