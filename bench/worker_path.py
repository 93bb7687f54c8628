"""The worker's own cost per task, without the other services: its stage runner driven
in-process over the tasks of one job of `true`, against the real PostgreSQL, RabbitMQ and
Redis, as many at a time as it has slots.

    python -m bench.worker_path [--tasks 1000] [--slots 2] [--isolation auto] [--cgroups]
    python -m bench.worker_path --profile 25      # and the 25 functions that cost most

Prints the worker's CPU per task (its own, and its children's: what starts the command, and
the command), and tasks/s. Nothing else runs the round or the relay: the tasks are claimed as
the dispatcher would (one statement), their work messages handed straight to the runner, and
the outbox rows they leave are deleted at the end. Use a database that the services are not
using, or stop them first (`scripts/down`): a running scheduler would relay and finalise
alongside.

The work dirs go under `--work-root` (default: /dev/shm, a tmpfs, where making a file costs
the same from one run to the next) and are removed at the end. On an ext4 without a journal
(this VM's root), each file made costs the kernel a scan past the inodes deleted in the last
minutes (`recently_deleted`): 0.3-0.8 ms a file after a run removed thousands, far less on a
quiet disk. Give `--work-root` a directory there to see it.
"""

import argparse
import asyncio
import cProfile
import pstats
import resource
import tempfile
import time
import uuid
from pathlib import Path

from redis.asyncio import Redis

from services.worker import launch
from services.worker.settings import WorkerSettings
from services.worker.stages import StageRunner
from shared.domain.messages import RunStage
from shared.domain.states import Stage
from shared.host.cgroups import Cgroups
from shared.messaging.amqp import open_broker
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.task_types.registry import load_task_types


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


async def _messages(pool: db.Pool, tasks: int) -> tuple[str, list[RunStage]]:
    """A job of `tasks` inputs of `true`, every task claimed: (its id, their work messages)."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, "bench-worker-path", "user", uuid.uuid4().hex)
        job, _ = await jobs_repo.create(
            conn, user.id, NewJob("bench-worker-path", "shell", "true", list(range(tasks)))
        )
        rows = await conn.fetch(
            "UPDATE tasks t SET claim = gen_random_uuid() FROM jobs j"
            " WHERE t.job_id = $1 AND j.id = t.job_id"
            " RETURNING t.id, t.claim, to_jsonb(t) AS row, j.xmin::text::bigint AS job_version,"
            " to_jsonb(j) AS job",
            job.id,
        )
    # what the planning round's claim puts in a work message (`plan_repo.claim`): the task as
    # claimed and its job's row version, and the job's row in its first input's message
    messages = [
        RunStage(
            job_id=job.id,
            task_id=r["id"],
            stage=Stage.SETUP,
            claim=r["claim"],
            claimed=r["row"],
            job_version=r["job_version"],
            job=r["job"] if i == 0 else None,
        )
        for i, r in enumerate(rows)
    ]
    return job.id, messages


async def _drive_all(runner: StageRunner, messages: list[RunStage], slots: int) -> None:
    queue = list(reversed(messages))

    async def one_slot() -> None:
        while queue:
            held = await runner.take(queue.pop())
            if held is None:
                raise RuntimeError("a claimed task could not be taken")
            await runner.drive(held)

    await asyncio.gather(*(one_slot() for _ in range(slots)))


async def _run(args: argparse.Namespace, work_root: Path) -> None:
    namespace = f"bench{uuid.uuid4().hex[:6]}"
    settings = WorkerSettings(  # the servers' URLs from VIGIL_* as every service reads them
        namespace=namespace,
        host_id=f"h-{namespace}",
        work_root=str(work_root),
        worker_slots=args.slots,
        job_isolation=args.isolation,
        cgroup_root="" if args.cgroups else "off",
    )
    redis = Redis.from_url(settings.redis_url)
    async with (
        db.open_pool(settings.database_url, max_size=20, generic_plans=True) as pool,
        open_broker(settings.amqp_url, Topology(namespace), name="bench-worker-path") as broker,
    ):
        runner = StageRunner(
            settings,
            pool,
            broker,
            redis,
            RedisKeys(namespace),
            load_task_types(),
            f"{settings.host_id}-bench",
            launch.choose(settings).launcher(pool, Cgroups.detect(namespace, settings.cgroup_root)),
        )
        job_id, messages = await _messages(pool, args.tasks)
        await _drive_all(runner, messages[: args.warmup], args.slots)  # plans, caches
        timed = messages[args.warmup :]
        profile = cProfile.Profile() if args.profile else None
        own, kids = _cpu()
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        await _drive_all(runner, timed, args.slots)
        if profile is not None:
            profile.disable()
        wall = time.perf_counter() - started
        own_after, kids_after = _cpu()
        await runner.background_done()
        states = await pool.fetch(
            "SELECT state, count(*) AS n FROM tasks WHERE job_id = $1 GROUP BY 1", job_id
        )
        async with pool.acquire() as conn:
            await conn.execute("DELETE FROM outbox WHERE body->>'job_id' = $1", job_id)
    await redis.aclose()
    n = len(timed)
    print(f"tasks            {n} ({args.warmup} before, untimed), {args.slots} slot(s)")
    counts = {r["state"]: r["n"] for r in states}
    print(f"states           {counts}")
    print(f"tasks/s          {n / wall:.1f}")
    print(f"worker CPU       {1000 * (own_after - own) / n:.2f} ms a task")
    print(f"children CPU     {1000 * (kids_after - kids) / n:.2f} ms a task")
    if profile is not None:
        stats = pstats.Stats(profile).sort_stats("tottime")
        stats.print_stats(args.profile)


def _default_root() -> str | None:
    """/dev/shm where there is one (see the module's doc), else the temporary directory."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--isolation", choices=["auto", "on", "off"], default="off")
    parser.add_argument("--cgroups", action="store_true", help="a cgroup per command")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="top N functions")
    parser.add_argument("--work-root", default=_default_root(), help="where the work dirs go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vigil-bench-", dir=args.work_root) as root:
        work_root = Path(root)
        work_root.chmod(0o711)
        asyncio.run(_run(args, work_root))


if __name__ == "__main__":
    main()
