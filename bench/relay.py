"""What relaying the outbox costs the leading scheduler, by itself: the relay's own
CPU a row, over the rows a task of a big job writes at steady state.

A task of a running job writes its work message (`host.<id>`, with the claimed row in it) and
six events (`setting_up`, `queued`, `on_cpu`, `data_ready`, `post_processing`, `completed`);
the bench writes `--tasks` tasks' rows in batches of `--per-round` tasks, interleaved by task as
many hosts' commits interleave them, and runs the relay (`services/scheduler/relay.py`, with
the scheduler's own `_on_published` and its tally) over each batch until nothing is left, on
a database of its own and the real broker. It prints the relay's own CPU (`process_time`: the
scheduler's process, never PostgreSQL's or RabbitMQ's) a row and a task.

    python -m bench.relay --tasks 20000 --per-round 16 [--profile]
"""

import argparse
import asyncio
import cProfile
import os
import pstats
import time
import uuid
from types import SimpleNamespace
from typing import Any

from bench.cluster import create_database, drop_database
from services.scheduler.due import Due, Pace
from services.scheduler.main import Scheduler
from services.scheduler.relay import Relay
from shared.domain.messages import RunStage, TaskEvent, encode
from shared.domain.states import Stage, TaskState
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology, delete_all
from shared.runtime import event_loop
from shared.store import activity, db

_ADMIN = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
_AMQP = os.environ.get("VIGIL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
_STATES = ("setting_up", "queued", "on_cpu", "data_ready", "post_processing", "completed")
#: Rows a relay batch reads at most (the scheduler's default `scheduler_batch`).
_BATCH = 500


def _work(job: str, task: str) -> str:
    """A claim's work message, with a claimed row of a task's size (the worker's take reads
    it from the message)."""
    claimed = {f"column_{n}": f"value of column {n} of {task}" for n in range(24)}
    message = RunStage(
        job_id=job, task_id=task, stage=Stage.SETUP, claim=uuid.uuid4(), claimed=claimed
    )
    return encode(message).decode()


def _event(job: str, task: str, state: str, previous: str, host: str) -> str:
    exit_code = 0 if state == TaskState.COMPLETED else None
    message = TaskEvent(
        job_id=job,
        task_id=task,
        state=TaskState(state),
        previous=TaskState(previous),
        host=host,
        exit_code=exit_code,
    )
    return encode(message).decode()


def _rows(job: str, first: int, count: int, hosts: int) -> list[tuple[str, str, str]]:
    """(exchange, routing key, body) of `count` tasks from task number `first` on."""
    rows: list[tuple[str, str, str]] = []
    tasks = [(f"{job}-{n}", f"h{n % hosts}") for n in range(first, first + count)]
    rows += [("work", f"host.{host}", _work(job, task)) for task, host in tasks]
    previous = TaskState.NEW.value
    for state in _STATES:
        for task, host in tasks:
            rows.append(("events", f"task.{state}.{job}", _event(job, task, state, previous, host)))
        previous = state
    return rows


def _scheduler(relay: Relay) -> Any:
    """What `Scheduler._on_published` reads of its scheduler, idle but for the tally."""
    never = Due(1.0)
    finaliser = SimpleNamespace(touch=lambda _job: None, cancelled=lambda _job: None)
    return SimpleNamespace(
        tally=activity.Tally(),
        pace=Pace(0.05, 1.0),
        triage_due=never,
        release_due=never,
        waiters_due=never,
        waiting=False,
        finaliser=finaliser,
        relay=relay,
    )


async def _run(tasks: int, per_round: int, hosts: int, profile: bool) -> None:
    name = f"relay{uuid.uuid4().hex[:8]}"
    url = await create_database(_ADMIN, name)
    topology = Topology(name)
    job = "j" + uuid.uuid4().hex[:12]
    try:
        async with db.open_pool(url) as pool, open_broker(_AMQP, topology, "bench") as broker:
            relay = Relay(pool, broker, _BATCH)
            scheduler = _scheduler(relay)
            wake = asyncio.Event()
            relay.on_published = lambda row: Scheduler._on_published(scheduler, row, wake)
            profiler = cProfile.Profile() if profile else None
            spent, rows, reads = 0.0, 0, 0
            for first in range(0, tasks, per_round):
                batch = _rows(job, first, min(per_round, tasks - first), hosts)
                await pool.executemany(
                    "INSERT INTO outbox (exchange, routing_key, body) VALUES ($1, $2, $3::jsonb)",
                    batch,
                )
                started = time.process_time()
                if profiler is not None:
                    profiler.enable()
                while (done := await relay.run_once()) > 0:
                    rows += done
                    reads += 1
                await relay.drain()
                if profiler is not None:
                    profiler.disable()
                spent += time.process_time() - started
            print(
                f"{tasks} tasks, {rows} rows in {reads} reads ({per_round} tasks a batch):"
                f" the relay's own CPU {1e6 * spent / rows:.1f} µs a row,"
                f" {1e3 * spent / tasks:.3f} ms a task",
                flush=True,
            )
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            await delete_all(broker.channel, topology, [f"h{n}" for n in range(hosts)])
    finally:
        await drop_database(_ADMIN, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--per-round", type=int, default=16)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    event_loop.run(_run(args.tasks, args.per_round, args.hosts, args.profile))  # the scheduler's


if __name__ == "__main__":
    main()
