"""Planner benchmark: one planning round, pure, no database.

    python -m bench.planner [--tasks 100000] [--jobs 1000] [--users 50] [--hosts 100] [--repeat 7]

Builds a pool of `--hosts` hosts (one in ten with 4 GPUs) and `--jobs` jobs of `--users`
users with `--tasks` tasks waiting among them (mixed requests: most 1 CPU, some larger, a few
GPU tasks; priorities and ages spread), then times `plan()` (the median of `--repeat`
rounds, inputs built beforehand) in two states of the pool:

- busy: every host nearly full (the steady state of a backlog): a few tasks placed, a
  reason for every job;
- idle: every host empty (after a drain, or at start): a whole pool's worth placed at once.

Then how the busy round grows with the jobs (the tasks with them) and with the hosts.
Prints figures, asserts nothing.
"""

import argparse
import random
import statistics
import time

from shared.domain.scheduling.model import (
    HostState,
    JobDemand,
    Plan,
    Round,
    Settings,
    UserState,
)
from shared.domain.scheduling.planner import plan
from shared.domain.scheduling.resources import Resources

NOW = 1_000_000.0


def _request(rng: random.Random) -> Resources:
    """Most tasks 1 CPU; some 2 to 4; a few 8 or 16 (large); a few with one or two GPUs."""
    draw = rng.random()
    if draw < 0.70:
        return Resources.of(1, 2048)
    if draw < 0.90:
        return Resources.of(rng.choice((2, 4)), rng.choice((4096, 8192)))
    if draw < 0.98:
        return Resources.of(rng.choice((8, 16)), rng.choice((16384, 65536)))
    return Resources.of(4, 16384, rng.choice((1, 2)))


def _jobs(rng: random.Random, tasks: int, jobs: int, users: int) -> list[JobDemand]:
    """`jobs` jobs spread over `users` users, `tasks` waiting tasks among them (uneven: a
    few large jobs, many small ones)."""
    weights = [rng.paretovariate(1.2) for _ in range(jobs)]
    scale = tasks / sum(weights)
    return [
        JobDemand(
            job_id=f"job-{n}",
            user=f"user-{n % users}",
            waiting=max(1, round(w * scale)),
            request=_request(rng),
            priority=rng.randint(-10, 10),
            waiting_since=NOW - rng.uniform(0, 7200),
            in_flight=rng.randint(0, 20),
            max_in_flight=rng.choice((None, None, 50, 500)),
        )
        for n, w in enumerate(weights)
    ]


def _hosts(rng: random.Random, count: int, busy: bool) -> list[HostState]:
    """32 CPUs and 128 GiB each, one in ten with 4 GPUs and 256 GiB; busy: a CPU or two
    and some memory free on each, a GPU free on a few."""
    hosts = []
    for n in range(count):
        gpus = 4 if n % 10 == 9 else 0
        capacity = Resources.of(32, 262144 if gpus else 131072, gpus)
        if not busy:
            hosts.append(HostState.idle(f"host-{n:04d}", capacity))
            continue
        free_gpus = rng.randint(0, 1) if gpus else 0
        free = Resources.of(rng.choice((0, 0, 1, 2)), rng.randint(0, 16384), free_gpus)
        ids = tuple(f"gpu{g}" for g in range(free_gpus))
        hosts.append(HostState(f"host-{n:04d}", capacity, free, ids))
    return hosts


def _users(rng: random.Random, count: int, busy: bool) -> dict[str, UserState]:
    return {
        f"user-{n}": UserState(
            f"user-{n}",
            share=rng.choice((1.0, 1.0, 2.0, 3.0)),
            usage=rng.uniform(0, 5e6) if busy else 0.0,
            in_flight=rng.randint(0, 200) if busy else 0,
            held=Resources.of(rng.randint(0, 200), rng.randint(0, 400_000))
            if busy
            else Resources(),
            cap=rng.choice((None, None, 1000)),
        )
        for n in range(count)
    }


def _round(tasks: int, jobs: int, users: int, hosts: int, busy: bool) -> Round:
    rng = random.Random(39)
    return Round(
        now=NOW,
        hosts=_hosts(rng, hosts, busy),
        jobs=_jobs(rng, tasks, jobs, users),
        users=_users(rng, users, busy),
    )


def _timed(round_: Round, repeat: int, settings: Settings) -> tuple[float, float, Plan]:
    """The median wall time and CPU time of `repeat` rounds (ms), and the plan: the CPU time
    is what the round costs, the wall time what it took on a machine others may be using."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = plan(round_, settings)
        cpus.append(1000 * (time.process_time() - cpu))
        walls.append(1000 * (time.perf_counter() - wall))
    return statistics.median(walls), statistics.median(cpus), result


def _line(label: str, round_: Round, repeat: int, settings: Settings) -> None:
    wall, cpu, result = _timed(round_, repeat, settings)
    placed = sum(a.count for a in result.assignments)
    waiting = sum(j.waiting for j in round_.jobs)
    print(
        f"  {label:<40} {wall:8.1f} ms {cpu:8.1f} ms cpu   {placed:6d} placed,"
        f" {len(result.waits):5d} reasons, {waiting} waiting"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    settings = Settings(prefetch=0)
    size = f"{args.tasks} tasks, {args.jobs} jobs, {args.users} users, {args.hosts} hosts"
    print(f"one round, median of {args.repeat} (wall, then CPU):")
    for busy in (True, False):
        round_ = _round(args.tasks, args.jobs, args.users, args.hosts, busy)
        _line(f"{'busy' if busy else 'idle'} pool: {size}", round_, args.repeat, settings)
    staged = Settings(prefetch=2)
    round_ = _round(args.tasks, args.jobs, args.users, args.hosts, True)
    _line("busy pool, prefetch 2 (staging too)", round_, args.repeat, staged)
    print("busy round, as jobs grow (tasks with them: 100 a job):")
    for jobs in (100, 1000, 10_000):
        round_ = _round(jobs * 100, jobs, args.users, args.hosts, True)
        _line(f"{jobs} jobs", round_, args.repeat, settings)
    print("busy round, as hosts grow (idle in brackets):")
    for hosts in (10, 100, 1000):
        for busy in (True, False):
            round_ = _round(args.tasks, args.jobs, args.users, hosts, busy)
            _line(f"{hosts} hosts{'' if busy else ' (idle)'}", round_, args.repeat, settings)


if __name__ == "__main__":
    main()
