"""Chaos run: mixed jobs on a cluster of its own while processes, workers, supervisors and the
broker are killed, then a check of every promise from PostgreSQL and from the jobs' own effects.

    python -m bench.chaos [--jobs 300] [--hosts 2] [--duration 60]
                          [--restarts postgresql,rabbitmq,redis]

It starts api, scheduler and `--hosts` hosts (worker + supervisor each) in a fresh database and
namespace, submits the jobs, and for `--duration` seconds: kills random job processes, workers
and supervisors (kill -9, then restarts them), freezes a worker (SIGSTOP) past its heartbeat
deadline and resumes it, and restarts each server of `--restarts` once, spread over the run
(PostgreSQL with `pg_ctlcluster ... restart -m fast`, RabbitMQ with `rabbitmqctl
stop_app/start_app`, Redis shut down and started again as this machine starts it: nothing on
disk). Then it waits until every job has ended and checks:

- no job lost; every task terminal, exactly one live (non-superseded) task per input;
- no two executions of one input overlapping in time (each execution takes a `flock` on a file
  of its own input and writes OVERLAP to the effects file if it finds it held);
- restartable tasks resubmitted within budget; non-restartable ones never, failed with a class
  that explains them;
- no leftover Redis keys or queued work messages for ended jobs; no surviving processes.

It prints those counts and the detection latency (kill → failed state) at p50/p99/max.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
from redis.asyncio import Redis

from bench.cluster import Cluster, create_database, drop_database
from services.scheduler.finaliser import REPURGE_AFTER_S
from shared.host.marks import marked_processes
from shared.messaging.topology import Topology, delete_all

INFRA = {"signal", "lost", "hung", "platform"}
MAX_INFRA = 4


@dataclass(frozen=True)
class Kind:
    """A kind of job: its command (after the effects prologue), policy and what may end it."""

    name: str
    command: str
    policy: dict[str, Any]
    classes: frozenset[str]  # failure classes that explain a failed task of this kind

    @property
    def restartable(self) -> bool:
        return bool(self.policy.get("restartable"))


_RETRY = {"restartable": True, "max_infra_retries": MAX_INFRA, "backoff": {"initial_s": 0.2}}
KINDS = [
    Kind("short", "sleep 0.$((RANDOM % 8 + 1)); echo done", _RETRY, frozenset(INFRA)),
    Kind("long", "sleep 4; echo done", _RETRY, frozenset(INFRA)),
    Kind("fragile", "sleep 4; echo done", {}, frozenset({"signal", "lost", "platform"})),
    Kind("failing", "sleep 0.3; exit 3", {}, frozenset({"exit", "signal", "lost", "platform"})),
    Kind(
        "error-log",
        'sleep 0.2; echo "ERROR: chaos says no" >&2; sleep 5',
        {},
        frozenset({"error_log", "signal", "lost", "platform"}),
    ),
    Kind(
        "hung",
        "echo hi; sleep 30",
        {"hang_timeout": 2},
        frozenset({"hung", "signal", "lost", "platform"}),
    ),
]
WEIGHTS = [40, 20, 10, 15, 8, 7]

CLUSTER_ENV = {
    # Jobs run confined, as they do for users: they share the effects file and the lock files
    # through the cluster's shared dir (`Cluster.shared_dir`).
    # detection scaled down: a killed or frozen worker is judged in 3 s, not 10, so that a
    # run of a minute sees many of them end
    "VIGIL_VITALS_S": "0.2",
    "VIGIL_KILL_GRACE_S": "1",
    "VIGIL_DEAD_WORKER_S": "3",
    "VIGIL_DEAD_HOST_S": "3",
    "VIGIL_FENCE_TIMEOUT_S": "30",  # a frozen worker's tasks are given up in 30 s, not 60
    "VIGIL_QUARANTINE_AFTER": "0",  # the chaos is ours: do not quarantine the hosts for it
    "VIGIL_LOG_LEVEL": "INFO",
    "VIGIL_GRACEFUL_TIMEOUT_S": "5",  # a stopped service waits 5 s for its work, not 10
}


@dataclass
class Chaos:
    """What was done to the cluster, for the report and the latency figures."""

    process_kills: list[tuple[float, str]] = field(default_factory=list)  # (time, task id)
    worker_kills: list[tuple[float, list[str]]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


@dataclass
class Report:
    jobs: int = 0
    tasks: int = 0
    job_states: Counter[str] = field(default_factory=Counter)
    failure_classes: Counter[str] = field(default_factory=Counter)
    resubmissions: int = 0
    chaos: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    def render(self) -> str:
        lines = [
            f"jobs {self.jobs} ({dict(self.job_states)}), tasks {self.tasks},"
            f" resubmissions {self.resubmissions}, in {self.elapsed_s:.0f}s",
            f"failure classes: {dict(self.failure_classes)}",
            f"chaos: {dict(self.chaos)}",
        ]
        if self.latencies:
            ordered = sorted(self.latencies)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            lines.append(
                f"detection latency (kill -> failed state), {len(ordered)} kills:"
                f" p50 {statistics.median(ordered) * 1000:.0f} ms,"
                f" p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
            )
        lines.append(f"problems: {len(self.problems)}")
        lines += [f"  - {p}" for p in self.problems[:50]]
        return "\n".join(lines)


def _prologue(root: Path) -> str:
    locks, effects = root / "locks", root / "effects.log"
    return (
        f'exec 9>"{locks}/$VIGIL_JOB_ID-$VIGIL_INPUT.lock"; '
        f'flock -n 9 || echo "OVERLAP $VIGIL_JOB_ID $VIGIL_INPUT $VIGIL_TASK_ID" >> "{effects}"; '
        f'echo "START $VIGIL_JOB_ID $VIGIL_INPUT $VIGIL_TASK_ID $$" >> "{effects}"; '
    )


async def submit(
    client: httpx.AsyncClient, root: Path, n: int, rng: random.Random
) -> dict[str, Kind]:
    """Submit `n` jobs of random kinds (1-2 inputs each); returns job id -> kind."""
    (root / "locks").mkdir(parents=True, exist_ok=True)
    (root / "locks").chmod(0o1777)  # the jobs make their lock files here, as their uid
    prologue = _prologue(root)
    jobs: dict[str, Kind] = {}
    for i in range(n):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        body = {
            "name": f"chaos-{kind.name}-{i}",
            "command": prologue + kind.command,
            "inputs": [f"i{k}" for k in range(rng.randint(1, 2))],
            "policy": kind.policy,
        }
        response = await client.post("/jobs", json=body)
        response.raise_for_status()
        jobs[response.json()["id"]] = kind
    return jobs


async def _on_cpu(conn: asyncpg.Connection, host: str | None = None) -> list[str]:
    rows = await conn.fetch(
        "SELECT id FROM tasks WHERE state = 'on_cpu' AND ($1::text IS NULL OR host = $1)", host
    )
    return [r["id"] for r in rows]


async def connect(url: str, within_s: float = 60) -> asyncpg.Connection:
    """A connection to `url`, waiting for a PostgreSQL that is restarting."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await asyncpg.connect(url)
        except (OSError, asyncpg.PostgresError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def make_chaos(
    cluster: Cluster,
    duration_s: float,
    rng: random.Random,
    restarts: Sequence[str],
) -> Chaos:
    """Hit the cluster for `duration_s` seconds."""
    dbs = [await connect(cluster.database_url)]
    try:
        return await _make_chaos(cluster, dbs, duration_s, rng, restarts)
    finally:
        await dbs[0].close()


async def _make_chaos(
    cluster: Cluster,
    dbs: list[asyncpg.Connection],
    duration_s: float,
    rng: random.Random,
    restarts: Sequence[str],
) -> Chaos:
    """`dbs`: the connection it reads with, replaced after a PostgreSQL restart."""
    chaos = Chaos()
    frozen: set[str] = set()
    background: list[asyncio.Task[None]] = []
    start = time.monotonic()
    due = [(start + duration_s * (i + 1) / (len(restarts) + 1), s) for i, s in enumerate(restarts)]
    # every server asked for is restarted, even when the restarts before it ran past the end
    while time.monotonic() - start < duration_s or due:
        await asyncio.sleep(rng.uniform(0.3, 1.2))
        if due and time.monotonic() >= due[0][0]:
            _, server = due.pop(0)
            await asyncio.to_thread(RESTARTS[server])
            chaos.counts[f"{server} restarts"] += 1
            if server == "postgresql":
                old = dbs.pop()
                dbs.append(await connect(cluster.database_url))
                await old.close()
            continue
        host = rng.choice([h for h in cluster.hosts if h not in frozen] or cluster.hosts)
        action = rng.choices(["process", "worker", "supervisor", "freeze"], [60, 15, 15, 10])[0]
        if action == "process":
            if _kill_a_process(cluster, rng, chaos):
                chaos.counts["job processes killed"] += 1
        elif host in frozen:
            continue
        elif action in ("worker", "supervisor"):
            held = await _on_cpu(dbs[0], host)
            cluster.kill(f"{action}@{host}")
            if action == "worker":
                chaos.worker_kills.append((time.time(), held))
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            cluster.start(f"{action}@{host}")
            chaos.counts[f"{action}s killed"] += 1
        else:
            frozen.add(host)
            background.append(asyncio.create_task(_freeze(cluster, host, frozen)))
            chaos.counts["workers frozen"] += 1
    await asyncio.gather(*background)
    return chaos


def _kill_a_process(cluster: Cluster, rng: random.Random, chaos: Chaos) -> bool:
    leaders = [
        m
        for host in cluster.hosts
        for m in marked_processes(cluster.namespace, host)
        if leads_group(m.pid)
    ]
    if not leaders:
        return False
    victim = rng.choice(leaders)
    try:
        os.kill(victim.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    chaos.process_kills.append((time.time(), victim.task_id))
    return True


def leads_group(pid: int) -> bool:
    """Whether `pid` leads its process group (a command, not one of its children)."""
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


async def _freeze(cluster: Cluster, host: str, frozen: set[str]) -> None:
    """SIGSTOP the worker past its heartbeat deadline (3 s), then SIGCONT."""
    proc = cluster.procs[f"worker@{host}"]
    proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(4.5)
    proc.send_signal(signal.SIGCONT)
    frozen.discard(host)


def restart_rabbitmq() -> None:
    for command in ("stop_app", "start_app", "await_startup"):
        subprocess.run(["rabbitmqctl", command], check=True, capture_output=True, timeout=120)


def restart_postgresql() -> None:
    [version] = [p.name for p in Path("/etc/postgresql").iterdir()]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
        timeout=120,
    )


def restart_redis() -> None:
    """Shut Redis down and start it again as this machine does (it keeps nothing on disk)."""
    subprocess.run(["redis-cli", "shutdown", "nosave"], capture_output=True, timeout=30)
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


RESTARTS: dict[str, Callable[[], None]] = {
    "postgresql": restart_postgresql,
    "rabbitmq": restart_rabbitmq,
    "redis": restart_redis,
}


async def wait_all_ended(db: asyncpg.Connection, jobs: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        active = await db.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND state IN ('active', 'suspended')",
            jobs,
        )
        if active == 0:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"jobs still running after {timeout_s}s")


async def check(
    cluster: Cluster, db: asyncpg.Connection, jobs: dict[str, Kind], chaos: Chaos, report: Report
) -> None:
    """Fill `report` from PostgreSQL, the effects file, Redis, the broker and /proc."""
    problems = report.problems
    rows = await db.fetch("SELECT id, state::text FROM jobs WHERE id = ANY($1)", list(jobs))
    report.jobs = len(rows)
    report.job_states = Counter(r["state"] for r in rows)
    if len(rows) != len(jobs):
        problems.append(f"{len(jobs) - len(rows)} submitted jobs are missing")
    problems += [
        f"job {r['id']} ended {r['state']}"
        for r in rows
        if r["state"] not in ("completed", "failed")
    ]
    tasks = await db.fetch(
        "SELECT id, job_id, input, state::text, failure_class::text, superseded_by,"
        " resubmitted_from FROM tasks WHERE job_id = ANY($1)",
        list(jobs),
    )
    report.tasks = len(tasks)
    report.failure_classes = Counter(t["failure_class"] for t in tasks if t["failure_class"])
    report.resubmissions = sum(t["resubmitted_from"] is not None for t in tasks)
    _check_lineages(tasks, jobs, problems)
    effects = _effects(cluster.shared_dir("chaos"))
    overlaps = [line for line in effects if line.startswith("OVERLAP")]
    problems += [f"two executions at once: {line}" for line in overlaps]
    completed = sum(t["state"] == "completed" for t in tasks)
    if completed and not any(line.startswith("START") for line in effects):
        # Without its effects the overlap check above proves nothing.
        problems.append(f"{completed} task(s) completed but none wrote to the effects file")
    await _check_leftovers(cluster, [r["id"] for r in rows], problems)
    report.latencies = await _latencies(db, chaos)


def _check_lineages(
    tasks: list[asyncpg.Record], jobs: dict[str, Kind], problems: list[str]
) -> None:
    terminal = {"completed", "terminated"} | {
        "failed_to_setup",
        "failed_on_cluster",
        "failed_to_post_process",
        "failed_setup_prerequisites",
        "failed_post_processing_prerequisites",
    }
    by_input: dict[tuple[str, str], list[asyncpg.Record]] = {}
    for task in tasks:
        by_input.setdefault((task["job_id"], json.dumps(task["input"])), []).append(task)
        if task["state"] not in terminal:
            problems.append(f"task {task['id']} is still {task['state']}")
    for (job_id, input_), lineage in by_input.items():
        kind = jobs[job_id]
        live = [t for t in lineage if t["superseded_by"] is None]
        if len(live) != 1:
            problems.append(f"job {job_id} input {input_}: {len(live)} live tasks")
            continue
        [last] = live
        if not kind.restartable and len(lineage) > 1:
            problems.append(f"non-restartable job {job_id} was resubmitted")
        if len(lineage) > MAX_INFRA + 1:
            problems.append(f"job {job_id} input {input_}: {len(lineage)} runs, budget {MAX_INFRA}")
        if last["state"] != "completed":
            cls = last["failure_class"]
            if cls not in kind.classes:
                problems.append(f"{kind.name} task {last['id']} failed as {cls} ({last['state']})")
            elif kind.restartable and cls in INFRA and len(lineage) <= MAX_INFRA:
                problems.append(f"restartable task {last['id']} failed as {cls} within budget")


def _effects(root: Path) -> list[str]:
    path = root / "effects.log"
    return path.read_text().splitlines() if path.exists() else []


async def _check_leftovers(cluster: Cluster, ended: list[str], problems: list[str]) -> None:
    # the supervisors' next sweep, the consumers' last no-ops, the finaliser's second purge
    await asyncio.sleep(REPURGE_AFTER_S + 3)
    redis = Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        pattern = f"{cluster.namespace}:vigil:job:*"
        keys = [k async for k in redis.scan_iter(match=pattern, count=1000)]
    finally:
        await redis.aclose()
    ended_set = set(ended)
    problems += [f"Redis key left for ended job: {k}" for k in keys if k.split(":")[3] in ended_set]
    topology = Topology(cluster.namespace)
    connection = await aio_pika.connect(cluster.amqp_url)
    try:
        channel = await connection.channel()
        names = [topology.pool_queue(), topology.dead_letter_queue] + [
            n for h in cluster.hosts for n in (topology.host_queue(h), topology.supervisor_queue(h))
        ]
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            count = queue.declaration_result.message_count
            if count:
                problems.append(f"{count} message(s) left in {name}")
    finally:
        await connection.close()
    survivors = [m for h in cluster.hosts for m in marked_processes(cluster.namespace, h)]
    problems += [f"process {m.pid} of task {m.task_id} survived" for m in survivors]


async def _latencies(db: asyncpg.Connection, chaos: Chaos) -> list[float]:
    """Seconds from each kill to the failed state of the task it hit (when it did fail)."""
    latencies = []
    hits = [(at, task) for at, task in chaos.process_kills]
    hits += [(at, task) for at, held in chaos.worker_kills for task in held]
    for at, task_id in hits:
        ended = await db.fetchval(
            "SELECT extract(epoch FROM min(ended_at)) FROM attempts WHERE task_id = $1"
            " AND failure_class IN ('signal', 'lost')"
            " AND ended_at >= to_timestamp($2) - interval '0.5 s'",
            task_id,
            at,
        )
        if ended is not None:
            latencies.append(max(0.0, float(ended) - at))
    return latencies


async def run(
    cluster: Cluster,
    *,
    jobs: int,
    duration_s: float,
    seed: int,
    restarts: Sequence[str] = (),
    timeout_s: float = 600,
) -> Report:
    """Submit, make chaos, wait, check. The cluster must be started."""
    rng = random.Random(seed)
    report = Report()
    began = time.monotonic()
    headers = {"Authorization": f"Bearer {cluster.token}"}
    db: asyncpg.Connection | None = None
    try:
        async with httpx.AsyncClient(base_url=cluster.base_url, headers=headers, timeout=30) as c:
            submitted = await submit(c, cluster.shared_dir("chaos"), jobs, rng)
        chaos = await make_chaos(cluster, duration_s, rng, restarts)
        db = await connect(cluster.database_url)
        report.chaos = chaos.counts
        await wait_all_ended(db, list(submitted), timeout_s)
        await check(cluster, db, submitted, chaos, report)
    finally:
        if db is not None:
            await db.close()
    report.elapsed_s = time.monotonic() - began
    return report


async def _main(args: argparse.Namespace) -> int:
    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    amqp_url = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    redis_url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    name = f"vigil_chaos_{uuid.uuid4().hex[:8]}"
    db_url = await create_database(admin_url, name)
    hosts = [f"chaos-h{i}" for i in range(args.hosts)]
    tmp = tempfile.mkdtemp(prefix="vigil-chaos-")
    cluster = Cluster(
        database_url=db_url,
        amqp_url=amqp_url,
        redis_url=redis_url,
        namespace=f"chaos-{uuid.uuid4().hex[:8]}",
        root=Path(tmp),
        hosts=hosts,
        slots=args.slots,
        extra_env=CLUSTER_ENV,
    )
    try:
        await asyncio.to_thread(cluster.start_all)
        report = await run(
            cluster,
            jobs=args.jobs,
            duration_s=args.duration,
            seed=args.seed,
            restarts=[s for s in args.restarts.split(",") if s],
        )
    finally:
        await asyncio.to_thread(cluster.stop_all)
        connection = await aio_pika.connect(amqp_url)
        try:
            await delete_all(await connection.channel(), Topology(cluster.namespace), hosts)
        finally:
            await connection.close()
        if args.keep:
            print(f"kept: {tmp} and database {db_url}")
        else:
            await drop_database(admin_url, name)
            cluster.remove_work_root()
            shutil.rmtree(tmp, ignore_errors=True)
    print(report.render())
    return 1 if report.problems else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument(
        "--restarts",
        default="postgresql,rabbitmq,redis",
        help="servers to restart once each, comma-separated ('' for none)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs and the database")
    sys.exit(asyncio.run(_main(parser.parse_args())))


if __name__ == "__main__":
    main()
