"""Dashboard benchmark: the pages of one big job, served in-process.

    python -m bench.dashboard [--inputs 100000] [--repeat 15]

Works on a database of its own (created, migrated and dropped on the local PostgreSQL, or the
server of `VIGIL_ADMIN_DATABASE_URL`); the api runs in this process (no server, no browser).
A job of N inputs is submitted through `POST /jobs`, a few hundred of its tasks are failed and
given log lines, and each page is fetched `--repeat` times by a signed-in browser's cookie:
the median and the slowest are printed, with the size of the page.
"""

import argparse
import asyncio
import os
import statistics
import time
import uuid

import httpx

from bench.cluster import create_database, drop_database
from services.api.app import create_app
from services.api.session import COOKIE
from services.api.settings import ApiSettings

ADMIN_URL = os.environ.get("VIGIL_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: Tasks failed (and given 20 log lines each) so that the filters and pages have something.
FAILED = 300


async def _timed(client: httpx.AsyncClient, label: str, path: str, repeat: int) -> None:
    took, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        answer = await client.get(path)
        took.append(time.perf_counter() - start)
        answer.raise_for_status()
        size = len(answer.content)
    print(
        f"{label:44s} median {1000 * statistics.median(took):7.1f} ms,"
        f" slowest {1000 * max(took):7.1f} ms, {size / 1024:6.0f} KiB"
    )


async def _bench(url: str, inputs: int, repeat: int) -> None:
    token = uuid.uuid4().hex
    settings = ApiSettings(database_url=url, bootstrap_token=token, max_inputs=max(inputs, 1))
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://api", cookies={COOKIE: token}, timeout=600
        ) as client,
    ):
        start = time.perf_counter()
        answer = await client.post(
            "/jobs",
            json={"command": "true", "inputs": [str(i) for i in range(inputs)]},
            headers={"Authorization": f"Bearer {token}"},
        )
        answer.raise_for_status()
        job_id = answer.json()["id"]
        print(f"submitted {inputs} inputs in {time.perf_counter() - start:.2f} s")
        pool = app.state.pool
        await pool.execute(
            "UPDATE tasks SET state = 'failed_on_cluster', failure_class = 'exit',"
            " error_brief = 'command exited with code 1' WHERE job_id = $1 AND index % $2 = 0",
            job_id,
            max(inputs // FAILED, 1),
        )
        await pool.execute(
            "INSERT INTO logs (job_id, task_id, run_number, attempt, line_no, ts, severity,"
            " stream, line) SELECT t.job_id, t.id, 1, 1, n, now(), 'info', 'stdout', 'line ' || n"
            " FROM tasks t, generate_series(1, 20) n"
            " WHERE t.job_id = $1 AND t.state = 'failed_on_cluster'",
            job_id,
        )
        await pool.execute("ANALYZE tasks; ANALYZE logs")
        last = await pool.fetchval("SELECT max(index) FROM tasks WHERE job_id = $1", job_id)
        some = await pool.fetch(
            "SELECT id FROM tasks WHERE job_id = $1 ORDER BY index DESC LIMIT 200", job_id
        )
        failed = await pool.fetchval(
            "SELECT id FROM tasks WHERE job_id = $1 AND state = 'failed_on_cluster' LIMIT 1",
            job_id,
        )
        rows = "&".join(f"task={r['id']}" for r in some)
        page = f"/ui/jobs/{job_id}"
        await _timed(client, "job page, first 200 tasks", page, repeat)
        await _timed(client, "job page, the last 200 tasks", f"{page}?after={last - 200}", repeat)
        await _timed(
            client, "job page, failed tasks only", f"{page}?state=failed_on_cluster", repeat
        )
        await _timed(client, "200 rows refreshed at once", f"{page}/rows?{rows}", repeat)
        await _timed(client, "a task page (with its 20 log lines)", f"/ui/tasks/{failed}", repeat)
        await _timed(client, "the jobs list", "/", repeat)


async def main(inputs: int, repeat: int) -> None:
    name = f"vigil_bench_pages_{uuid.uuid4().hex[:8]}"
    url = await create_database(ADMIN_URL, name)
    try:
        await _bench(url, inputs, repeat)
    finally:
        await drop_database(ADMIN_URL, name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(main(args.inputs, args.repeat))
