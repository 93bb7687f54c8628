"""A worker hands a running command to its host's supervisor through Redis.

A command that runs `follow_after_s` is handed over (`WatchProcess`): the supervisor follows
it by its pidfd, its vitals and its error log, so that it is judged even if the worker dies.
The hand-over went through the broker, to the supervisor's quorum queue: a message each task,
which the broker writes, replicates, delivers and settles. That was half of what a task cost
RabbitMQ, for a message between two processes of one host.

Now the worker pushes it on the host's list in Redis (`RedisKeys.handovers`), and the
supervisor waits on that list (`BLPOP`): a command each, and nothing while idle. It was best
effort before and still is: a hand-over lost with Redis is found by the supervisor's
reconcile, which follows every task it finds `on_cpu` on its host in PostgreSQL. The list
keeps at most `MOST_WAITING` (a supervisor long gone) and expires `TTL_S` after its last push.
A hand-over the supervisor takes late is judged as any: a process that is gone, or a task that
moved on, is dropped by its watcher.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from redis.asyncio import Redis

from shared.domain.errors import UNAVAILABLE, InvalidMessage
from shared.domain.messages import WatchProcess, decode, encode
from shared.runtime.lifecycle import unless_stopped, wait_or_stop

logger = logging.getLogger(__name__)

#: The most hand-overs a host's list keeps (the oldest go first).
MOST_WAITING: Final = 10_000
#: A list no worker pushed to for this long is dropped.
TTL_S: Final = 24 * 3600
#: How long one wait for a hand-over blocks (below the client's socket timeout).
WAIT_S: Final = 2
#: The pause after Redis did not answer, before waiting again.
PAUSE_S: Final = 1.0


async def hand_over(redis: Redis, key: str, watch: WatchProcess) -> None:
    """Push `watch` on the host's list `key` (one round trip)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.rpush(key, encode(watch))
        pipe.ltrim(key, -MOST_WAITING, -1)
        pipe.expire(key, TTL_S)
        await pipe.execute()


async def take(redis: Redis, keys: list[str], wait_s: float = WAIT_S) -> WatchProcess | None:
    """The next hand-over on any of the lists `keys`, waiting at most `wait_s`; None if none
    came (or what came was not a hand-over: logged and dropped)."""
    got = await redis.blpop(keys, timeout=wait_s)
    if got is None:
        return None
    _key, body = got
    try:
        message = decode(body)
    except InvalidMessage as exc:
        logger.warning("dropped a hand-over that is not one: %s", exc)
        return None
    if not isinstance(message, WatchProcess):
        logger.warning("dropped a %s on a hand-over list", message.type)
        return None
    return message


async def follow(
    redis: Redis, keys: list[str], handle: Callable[[WatchProcess], None], stop: asyncio.Event
) -> None:
    """Give `handle` each hand-over on the lists `keys` until `stop` (a wait under way is cut
    short); wait again after Redis comes back (what was lost meanwhile is the reconcile's)."""
    while not stop.is_set():
        try:
            watch = await unless_stopped(stop, take(redis, keys, WAIT_S))
        except UNAVAILABLE as exc:
            logger.warning("cannot take hand-overs, will retry: %s", exc)
            await wait_or_stop(stop, PAUSE_S)
            continue
        if watch is not None:
            handle(watch)
