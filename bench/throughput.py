"""Throughput benchmark: N jobs of `true` through the API, end to end.

Runs against a system that is up (`scripts/up`): `python -m bench.throughput [--jobs 2000]`.
Prints jobs/s from the first submit to the last completion, and submit-to-start latency
(job created → its command started on a worker) at p50/p99, under that load (mostly backlog)
and on an idle system (`--probes` jobs submitted one at a time).
"""

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx


def _token() -> str:
    token = os.environ.get("VIGIL_TOKEN") or os.environ.get("VIGIL_BOOTSTRAP_TOKEN")
    if token:
        return token
    path = Path(".run/token")
    if path.exists():
        return path.read_text().strip()
    raise SystemExit("no token: set VIGIL_TOKEN or run scripts/up first")


async def _submit(client: httpx.AsyncClient, name: str, n: int, concurrency: int) -> list[str]:
    ids: list[str] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            response = await client.post("/jobs", json={"name": name, "command": "true"})
            response.raise_for_status()
            ids.append(response.json()["id"])

    await asyncio.gather(*(one() for _ in range(n)))
    return ids


async def _wait_done(client: httpx.AsyncClient, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page = (
            await client.get("/jobs", params={"name": name, "state": "active", "limit": 1})
        ).json()
        if not page["items"]:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"jobs still active after {timeout_s}s")


async def _start_latencies(
    client: httpx.AsyncClient, ids: list[str], concurrency: int
) -> tuple[list[float], dict[str, int]]:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    states: dict[str, int] = {}

    async def one(job_id: str) -> None:
        async with gate:
            job = (await client.get(f"/jobs/{job_id}")).json()
            states[job["state"]] = states.get(job["state"], 0) + 1
            for task in (await client.get(f"/jobs/{job_id}/tasks")).json():
                detail: dict[str, Any] = (await client.get(f"/tasks/{task['id']}")).json()
                starts = [a["started_at"] for a in detail["attempts"] if a["stage"] == "cluster"]
                if starts:
                    created = datetime.fromisoformat(job["created_at"])
                    latencies.append((datetime.fromisoformat(starts[0]) - created).total_seconds())

    await asyncio.gather(*(one(i) for i in ids))
    return latencies, states


async def _probe(client: httpx.AsyncClient, name: str, n: int) -> list[str]:
    """Submit `n` jobs one at a time, each once the previous one is done."""
    ids = []
    for _ in range(n):
        response = await client.post("/jobs", json={"name": name, "command": "true"})
        response.raise_for_status()
        ids.append(response.json()["id"])
        await _wait_done(client, name, 30)
    return ids


def _report(label: str, latencies: list[float]) -> None:
    if not latencies:
        return
    p50, p99 = _pct(latencies, 50) * 1000, _pct(latencies, 99) * 1000
    mean = statistics.mean(latencies) * 1000
    print(f"{label}: p50 {p50:.0f} ms, p99 {p99:.0f} ms, mean {mean:.0f} ms")


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--url", default=os.environ.get("VIGIL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--probes", type=int, default=50)
    args = parser.parse_args()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {_token()}"}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=60) as client:
        started = time.monotonic()
        ids = await _submit(client, name, args.jobs, args.concurrency)
        submitted = time.monotonic()
        await _wait_done(client, name, args.timeout)
        finished = time.monotonic()
        latencies, states = await _start_latencies(client, ids, args.concurrency)
        probe_ids = await _probe(client, name + "-idle", args.probes)
        idle, _ = await _start_latencies(client, probe_ids, args.concurrency)
    total = finished - started
    print(f"jobs: {len(ids)} ({', '.join(f'{k}={v}' for k, v in sorted(states.items()))})")
    print(f"submit: {len(ids) / (submitted - started):.0f} jobs/s over {submitted - started:.1f}s")
    print(f"end to end: {len(ids) / total:.0f} jobs/s ({total:.1f}s, submit to all done)")
    _report("submit-to-start under load", latencies)
    _report("submit-to-start when idle", idle)


if __name__ == "__main__":
    asyncio.run(main())
