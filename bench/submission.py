"""Submission benchmark: how long `POST /jobs` takes to accept a job of N inputs (the
target: 100,000 inputs in at most 3 s), the api served in-process.

    python -m bench.submission [--inputs 100000] [--repeat 5]

Works on a database of its own (created, migrated and dropped on the local PostgreSQL, or the
server of `VIGIL_ADMIN_DATABASE_URL`); no service runs, so nothing relays or runs the tasks
meanwhile. The body is sent as JSON bytes made beforehand: what is timed is the api's reading,
checking and writing of it (the job, its tasks and their `task.new` events, one transaction),
and its answer. Prints each submission's time, then the median and the fastest.
"""

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

import httpx

from bench.cluster import create_database, drop_database
from services.api.app import create_app
from services.api.settings import ApiSettings

ADMIN_URL = os.environ.get("VIGIL_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def _bench(url: str, inputs: int, repeat: int) -> list[float]:
    token = uuid.uuid4().hex
    settings = ApiSettings(database_url=url, bootstrap_token=token, max_inputs=max(inputs, 1))
    app = create_app(settings)
    body = json.dumps({"command": "true", "inputs": [str(i) for i in range(inputs)]}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    took: list[float] = []
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=600
        ) as client,
    ):
        for _ in range(repeat):
            start = time.perf_counter()
            answer = await client.post("/jobs", content=body, headers=headers)
            took.append(time.perf_counter() - start)
            answer.raise_for_status()
            print(f"{inputs} inputs accepted in {took[-1]:.2f} s", flush=True)
    return took


async def main(inputs: int, repeat: int) -> None:
    name = f"vigil_bench_submit_{uuid.uuid4().hex[:8]}"
    url = await create_database(ADMIN_URL, name)
    try:
        took = await _bench(url, inputs, repeat)
    finally:
        await drop_database(ADMIN_URL, name)
    print(f"median {statistics.median(took):.2f} s, fastest {min(took):.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.inputs, args.repeat))
