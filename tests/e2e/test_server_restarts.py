"""Servers restarted for real. PostgreSQL (`pg_ctlcluster ... restart`), idle and under load:
every service rides through on its own, no job is lost, no task pays for it, and `/healthz`
says what it waits for meanwhile. RabbitMQ (`rabbitmqctl stop_app`, `start_app`): a user's
`vigil events -f` stream goes on across it, and shows the next job's end as it happens."""

import asyncio
import queue
import select
import subprocess
import threading
import time
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import pytest

from bench.chaos import restart_postgresql, restart_rabbitmq
from tests.e2e.conftest import VIGIL
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

POLICY = {"restartable": True, "backoff": {"initial_s": 0.2, "max_s": 1}}


async def _get(client: httpx.AsyncClient, path: str, within: float = 60) -> Any:
    """GET `path` until the api answers 200 (it answers 503 while the database is away)."""
    async with asyncio.timeout(within):
        while True:
            try:
                response = await client.get(path)
                if response.status_code == 200:
                    return response.json()
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)  # polling the API: no event stream survives the restart


async def _ended(client: httpx.AsyncClient, job_ids: list[str], within: float) -> list[Any]:
    async with asyncio.timeout(within):
        while True:
            jobs = [await _get(client, f"/jobs/{job_id}") for job_id in job_ids]
            if all(job["state"] not in ("active", "suspended") for job in jobs):
                return jobs
            await asyncio.sleep(0.5)


async def _failures(stack: Stack) -> list[tuple[str, str | None, str | None]]:
    conn = await asyncpg.connect(stack.database_url)
    try:
        rows = await conn.fetch(
            "SELECT state::text, failure_class::text, error_brief FROM tasks"
            " WHERE failure_class IS NOT NULL ORDER BY updated_at"
        )
    finally:
        await conn.close()
    return [(r["state"], r["failure_class"], r["error_brief"]) for r in rows]


async def _submit(client: httpx.AsyncClient, n: int, command: str, inputs: int) -> list[str]:
    ids = []
    for i in range(n):
        body = {
            "name": f"restart-{i}",
            "command": command,
            "inputs": [str(k) for k in range(inputs)],
            "policy": POLICY,
        }
        response = await client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


async def test_when_postgresql_restarts_idle_then_under_load__every_service_rides_through(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    # idle: the services wait for it, and a job submitted afterwards completes
    await asyncio.to_thread(restart_postgresql)
    [after_idle] = await _submit(client, 1, "echo after", 2)
    assert (await _ended(client, [after_idle], 60))[0]["state"] == "completed"
    assert all(proc.poll() is None for proc in stack.procs.values()), "a service died"

    # under load: 12 jobs of 5 short tasks, 4 slots, restarted while they run
    job_ids = await _submit(client, 12, "sleep 0.2", 5)

    async def running() -> bool:
        return bool((await _get(client, f"/jobs/{job_ids[0]}"))["counts"].get("on_cpu"))

    async with asyncio.timeout(30):
        while not await running():  # noqa: ASYNC110  (polling the API)
            await asyncio.sleep(0.1)
    await asyncio.to_thread(restart_postgresql)

    jobs = await _ended(client, job_ids, 180)
    assert [job["state"] for job in jobs] == ["completed"] * len(jobs)
    failures = await _failures(stack)
    assert not [f for f in failures if f[1] != "platform"], failures  # no job nor host blamed
    assert all(proc.poll() is None for proc in stack.procs.values()), "a service died"
    health = await _get(client, "/healthz")
    assert health["status"] == "ok", health
    print(f"tasks failed by the restart and resubmitted: {len(failures)}")  # noqa: T201


#: How soon after a job's end a follower sees it, the broker restarted or not: well under the
#: stream's 5 s quiet look at the history (a stream whose queue was being restored when the end
#: was published shows it only then, unless its restore wakes it).
SEEN_WITHIN_S = 2.0


class Follower:
    """`vigil events -f PATTERN` as a user runs it: each line it prints, with when it came."""

    def __init__(self, env: dict[str, str], pattern: str) -> None:
        self.proc = subprocess.Popen(
            [str(VIGIL), "events", "-f", pattern],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        ready, _, _ = select.select([self.proc.stderr], [], [], 15)
        assert ready, "vigil events did not open its stream in 15 s"
        assert self.proc.stderr.readline().startswith("following "), self.proc.stderr.read()
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.time(), line))

    async def seen(self, routing_key: str, within: float) -> float:
        """When the line of the event `routing_key` was printed (epoch seconds)."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{routing_key} not printed in {within} s"
            try:
                at, line = await asyncio.to_thread(self.lines.get, True, min(left, 1.0))
            except queue.Empty:
                continue
            if line.startswith(f"{routing_key} {{"):
                return at

    def close(self) -> str:
        """Stop it; what it said on stderr."""
        self.proc.kill()
        _, err = self.proc.communicate(timeout=10)
        return err


async def _ends(client: httpx.AsyncClient, follower: Follower, command: str) -> float:
    """Run a job of `command`; how long after its end (`finished_at`) the follower printed it."""
    response = await client.post("/jobs", json={"command": command})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    seen_at = await follower.seen(f"job.succeeded.{job_id}", within=90)
    job = await _get(client, f"/jobs/{job_id}")
    return seen_at - datetime.fromisoformat(job["finished_at"]).timestamp()


async def test_when_rabbitmq_restarts__a_followed_event_stream_shows_the_next_jobs_end_at_once(
    client: httpx.AsyncClient, env: dict[str, str]
) -> None:
    # given: an operator following every job's end, which shows a first job's
    follower = Follower(env, "job.*.*")
    try:
        assert await _ends(client, follower, "echo before") < SEEN_WITHIN_S

        # when: the broker restarts
        await asyncio.to_thread(restart_rabbitmq)

        # then: the same command, still running, prints the next jobs' ends as they happen
        # (two in a row: a stream that only read its history now and then, every few seconds,
        # would show the second late, as it comes right after such a read)
        lags = [await _ends(client, follower, f"echo after-{n}") for n in (1, 2)]
        assert follower.proc.poll() is None, "vigil events -f ended"
    finally:
        said = follower.close()
    print(f"seen after each job's end: {', '.join(f'{lag:.2f} s' for lag in lags)}")  # noqa: T201
    assert max(lags) < SEEN_WITHIN_S, f"seen {lags} s after the jobs ended; stderr: {said}"
