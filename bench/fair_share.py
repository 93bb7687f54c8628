"""Fair share on the real services: how the pool's capacity is split
between users who compete for it.

    python -m bench.fair_share [--minutes 2] [--cpus 4] [--task-s 2]

Starts the four services (one host of `--cpus` CPUs), then runs two phases of `--minutes`
each, with users of their own: two users of equal shares, then two of shares 3 and 1. In each
phase both users submit, at the same moment, more `sleep --task-s` tasks than the phase can
run (so both wait throughout), and the benchmark adds up, from the attempts' start and end
times, the CPU-seconds each user's commands held within the phase (its first task's length
left out, while the first placements settle). It also runs a lone user for five task
lengths (how busy it keeps the host: work-conserving), and times a late user's one `echo`
behind another's 12 x `sleep 8` and 5,000 x `sleep 2` (the case of a user who
waits behind a big job). Prints each user's
part of the capacity; asserts nothing. The target: 50 / 50 and 75 / 25, each ± 5 %.
"""

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import httpx

from bench.cluster import Cluster, create_database, drop_database

_ENV = {
    "VIGIL_LOG_LEVEL": "WARNING",
    "VIGIL_DEAD_HOST_S": "3",
    "VIGIL_QUARANTINE_AFTER": "0",
}


async def _user(ops: httpx.AsyncClient, name: str, share: float) -> httpx.AsyncClient:
    made = await ops.post("/admin/users", json={"name": name})
    made.raise_for_status()
    if share != 1:
        (await ops.patch(f"/admin/users/{name}", json={"share": share})).raise_for_status()
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    return httpx.AsyncClient(base_url=str(ops.base_url), headers=headers, timeout=30)


async def _submit(client: httpx.AsyncClient, tasks: int, task_s: float) -> str:
    body = {"command": f"sleep {task_s}", "inputs": [str(i) for i in range(tasks)]}
    response = await client.post("/jobs", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


async def _cancel(client: httpx.AsyncClient, job_id: str) -> None:
    await client.post(f"/jobs/{job_id}/actions", json={"action": "cancel"})


async def _held_s(db: asyncpg.Connection, job_id: str, start: datetime, end: datetime) -> float:
    """CPU-seconds the job's commands held within [start, end] (1 CPU each)."""
    value = await db.fetchval(
        "SELECT coalesce(sum(extract(epoch FROM least(coalesce(a.ended_at, $3), $3)"
        " - greatest(a.started_at, $2))), 0)::float8"
        " FROM attempts a JOIN tasks t ON t.id = a.task_id"
        " WHERE t.job_id = $1 AND a.stage = 'cluster' AND a.started_at < $3"
        " AND coalesce(a.ended_at, $3) > $2",
        job_id,
        start,
        end,
    )
    return float(value)


async def _phase(
    ops: httpx.AsyncClient,
    db: asyncpg.Connection,
    shares: list[float],
    seconds: float,
    cpus: int,
    task_s: float,
) -> tuple[list[float], float]:
    """Each user's part (%) of what ran over the phase, and how busy the host was (%)."""
    tag = uuid.uuid4().hex[:6]
    users = [await _user(ops, f"fs-{tag}-{n}", share) for n, share in enumerate(shares)]
    tasks = int(seconds / task_s * cpus) + 8 * cpus
    jobs = await asyncio.gather(*(_submit(u, tasks, task_s) for u in users))
    began = await db.fetchval("SELECT now()")
    await asyncio.sleep(seconds)
    ended = await db.fetchval("SELECT now()")
    for user, job_id in zip(users, jobs, strict=True):
        await _cancel(user, job_id)
        await user.aclose()
    start = began + timedelta(seconds=task_s)
    held = [await _held_s(db, job_id, start, ended) for job_id in jobs]
    total = sum(held) or 1.0
    busy = 100 * sum(held) / (cpus * (ended - start).total_seconds())
    return [100 * h / total for h in held], busy


async def _late_user(
    ops: httpx.AsyncClient, db: asyncpg.Connection, tasks: int, task_s: float
) -> float:
    """Seconds from a late user's one `echo`, submitted 1 s after another user's `tasks`
    tasks of `task_s` s, to its job's end."""
    tag = uuid.uuid4().hex[:6]
    alice, bob = await _user(ops, f"alice-{tag}", 1), await _user(ops, f"bob-{tag}", 1)
    alice_job = await _submit(alice, tasks, task_s)
    await asyncio.sleep(1)
    submitted = time.monotonic()
    response = await bob.post("/jobs", json={"command": "echo hi", "inputs": ["x"]})
    response.raise_for_status()
    bob_job = response.json()["id"]
    while True:
        if await db.fetchval("SELECT finished_at FROM jobs WHERE id = $1", bob_job):
            break
        await asyncio.sleep(0.05)
    took = time.monotonic() - submitted
    await _cancel(alice, alice_job)
    await alice.aclose()
    await bob.aclose()
    return took


async def main(args: argparse.Namespace) -> None:
    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    name = f"vigil_fair_{uuid.uuid4().hex[:8]}"
    db_url = await create_database(admin_url, name)
    tmp = tempfile.mkdtemp(prefix="vigil-fair-")
    cluster = Cluster(
        database_url=db_url,
        amqp_url=os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        redis_url=os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
        namespace=f"fair-{uuid.uuid4().hex[:8]}",
        root=Path(tmp),
        hosts=["fair-h1"],
        slots=args.cpus,
        extra_env=_ENV,
    )
    try:
        await asyncio.to_thread(cluster.start_all)
        headers = {"Authorization": f"Bearer {cluster.token}"}
        db = await asyncpg.connect(db_url)
        async with httpx.AsyncClient(base_url=cluster.base_url, headers=headers) as ops:
            seconds = args.minutes * 60
            began = time.monotonic()
            _, lone_busy = await _phase(ops, db, [1], 5 * args.task_s, args.cpus, args.task_s)
            equal, equal_busy = await _phase(ops, db, [1, 1], seconds, args.cpus, args.task_s)
            weighted, _ = await _phase(ops, db, [3, 1], seconds, args.cpus, args.task_s)
            behind_12 = await _late_user(ops, db, 12, 8)
            behind_5000 = await _late_user(ops, db, 5000, 2)
        await db.close()
        print(f"one host of {args.cpus} CPUs, tasks of {args.task_s:g} s, phases of {seconds:g} s")
        print(f"shares 1 : 1 -> {equal[0]:.1f} % / {equal[1]:.1f} %  (target 50 / 50 +- 5)")
        print(f"shares 3 : 1 -> {weighted[0]:.1f} % / {weighted[1]:.1f} %  (target 75 / 25 +- 5)")
        print(f"a lone user keeps the host {lone_busy:.0f} % busy; two users {equal_busy:.0f} %")
        print(f"a late user's echo ends {behind_12:.1f} s after its submission behind another's")
        print(
            f"  12 x sleep 8 (target <= 10 s), {behind_5000:.1f} s behind 5,000 x sleep 2 (<= 5 s)"
        )
        print(f"elapsed {time.monotonic() - began:.0f} s")
    finally:
        await asyncio.to_thread(cluster.stop_all)
        await drop_database(admin_url, name)
        cluster.remove_work_root()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--task-s", type=float, default=2.0)
    asyncio.run(main(parser.parse_args()))
