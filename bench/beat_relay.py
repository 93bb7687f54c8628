"""What writing hosts' beats from Redis costs the leading scheduler: `--hosts`
hosts' two services each push a beat on the board, and the relay (`services/scheduler/
beat_relay.py`) takes, writes and answers them; its own CPU per beat, over `--rounds` rounds.

    python -m bench.beat_relay --hosts 1000 --rounds 20 [--profile]
"""

import argparse
import asyncio
import cProfile
import os
import pstats
import time
import uuid

from bench.cluster import create_database, drop_database
from services.scheduler.beat_relay import BeatRelay
from shared.messaging.beat_board import BeatBoard, Kind
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.runtime.config import DEFAULT_POOL
from shared.store import db

_ADMIN = os.environ.get("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
_REDIS = os.environ.get("VIGIL_REDIS_URL", "redis://127.0.0.1:6379/0")


async def _run(hosts: int, rounds: int, profile: bool) -> None:
    name = f"relay{uuid.uuid4().hex[:8]}"
    url = await create_database(_ADMIN, name)
    keys = RedisKeys(name)
    ids = [f"h{n}" for n in range(hosts)]
    try:
        async with db.open_pool(url) as pool, open_redis(_REDIS) as redis:
            await pool.executemany(
                "INSERT INTO hosts (id, slots, worker, supervisor, pool, heartbeat_at)"
                " VALUES ($1, 16, 'w-' || $1, 's-' || $1, $2, now())",
                [(host, DEFAULT_POOL) for host in ids],
            )
            board, relay = BeatBoard(redis, keys), BeatRelay(pool, BeatBoard(redis, keys))
            spent = 0.0
            profiler = cProfile.Profile() if profile else None
            for seq in range(1, rounds + 1):
                for n in range(0, hosts, 50):  # the client's pool holds 100 connections
                    some = ids[n : n + 50]
                    await asyncio.gather(
                        *(board.beat(Kind.WORKER, h, "w-" + h, seq, 0.0, 10) for h in some),
                        *(board.beat(Kind.SUPERVISOR, h, "s-" + h, seq, 10.0) for h in some),
                    )
                started = time.process_time()
                if profiler is not None:
                    profiler.enable()
                answered = await relay.run_once()
                if profiler is not None:
                    profiler.disable()
                spent += time.process_time() - started
                assert answered == 2 * hosts, answered
            beats = 2 * hosts * rounds
            print(
                f"{hosts} hosts: the relay's own CPU {1e6 * spent / beats:.1f} µs a beat"
                f" ({1e3 * spent / rounds:.1f} ms a round of {2 * hosts} beats)",
                flush=True,
            )
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
            await redis.delete(keys.beats(), keys.beat_answers())
    finally:
        await drop_database(_ADMIN, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(_run(args.hosts, args.rounds, args.profile))


if __name__ == "__main__":
    main()
