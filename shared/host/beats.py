"""A host service's heartbeats through Redis: a beat costs PostgreSQL a transaction
of its own (0.24 ms), and a thousand idle hosts' two services beat 800 times a second. Through
Redis, the leading scheduler writes them all in one transaction a second
(`services/scheduler/beat_relay.py`, `shared/messaging/beat_board.py`).

What the fence (`shared/host/fence.py`) needs of a beat is kept:
- **A lease is renewed only by a beat PostgreSQL saw.** The scheduler answers a beat once it
  has written it into `hosts`; the answer renews the lease as of when that beat was *sent*. A
  beat's row is dated when the beat reached Redis, never earlier than it was sent.
- **A host cut off from PostgreSQL stops counting as alive.** Its services would go on
  reaching Redis, and the scheduler would keep them alive in `hosts` while nothing they report
  lands. So a service beats through Redis only while it has itself reached PostgreSQL lately:
  it probes it (`SELECT 1`, a read: no commit) every `probe_every_s`, and after two periods
  without reaching it, beats PostgreSQL itself, which fails: its row ages, the reaper declares
  it dead, and its lease runs out (the fence).
- **An answer that does not come** (no leader, Redis away, a slow round) is no harm: a beat
  whose previous one is not answered yet is sent to PostgreSQL by the service itself, as
  before. So a live host's row is never older than two beats, whoever writes it.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.asyncio import Redis

from shared.domain.errors import UNAVAILABLE
from shared.messaging.beat_board import Answer, BeatBoard, Heard, Kind
from shared.messaging.redis_keys import RedisKeys
from shared.store.db import Pool

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class BeatBook:
    """One service's beats: which it sent when, and when it last reached PostgreSQL itself
    (monotonic seconds)."""

    #: How often the service proves to itself that it reaches PostgreSQL.
    probe_every_s: float
    seq: int = 0
    sent: dict[int, float] = field(default_factory=dict)
    #: When a statement that reached PostgreSQL was sent (None: none yet).
    reached_at: float | None = None

    def through_redis(self, now: float) -> bool:
        """Whether to beat through Redis: only while PostgreSQL was reached within two probe
        periods (a first beat, or one after a cut, goes to PostgreSQL)."""
        return self.reached_at is not None and now - self.reached_at <= 2 * self.probe_every_s

    def probe_due(self, now: float) -> bool:
        return self.reached_at is None or now - self.reached_at >= self.probe_every_s

    def reached(self, sent_at: float) -> None:
        """A statement sent at `sent_at` reached PostgreSQL."""
        self.reached_at = sent_at if self.reached_at is None else max(self.reached_at, sent_at)

    def next(self, now: float) -> int:
        """The number of a beat sent now (only the last two are kept: an answer to an older
        one renews nothing)."""
        self.seq += 1
        self.sent[self.seq] = now
        self.sent.pop(self.seq - 2, None)
        return self.seq

    def answered(self, answer: Answer | None, instance: str) -> float | None:
        """When the beat `answer` is for was sent, if it is this instance's and one of its
        last two beats (the one just sent or the one before); None otherwise."""
        if answer is None or answer.instance != instance or answer.seq < self.seq - 1:
            return None
        return self.sent.get(answer.seq)


@dataclass
class ThroughRedis:
    """A service's way to beat through Redis: the board and its own book."""

    board: BeatBoard
    book: BeatBook
    #: A beat Redis has not taken within this long goes to PostgreSQL.
    timeout_s: float = 1.0
    #: The probe of PostgreSQL under way, if any (the beats never wait for it).
    probing: "asyncio.Task[None] | None" = None


def through_redis_if(
    enabled: bool, redis: Redis, keys: RedisKeys, dead_host_s: float
) -> ThroughRedis | None:
    """A service's way through Redis, probing PostgreSQL every `dead_host_s`, giving Redis a
    tenth of it to take a beat; None when its beats go to PostgreSQL only
    (`VIGIL_BEATS_THROUGH_REDIS=false`)."""
    if not enabled:
        return None
    return ThroughRedis(BeatBoard(redis, keys), BeatBook(dead_host_s), dead_host_s / 10)


async def send(
    via: ThroughRedis,
    who: tuple[Kind, str, str],
    dead_worker_s: float = 0.0,
    registration_ttl_s: int | None = None,
) -> Heard | None:
    """Beat through Redis as `who` (kind, host, instance), if the book allows it (a worker's
    beat also refreshes its registration for `registration_ttl_s`); what it heard back. None:
    not sent (the caller beats PostgreSQL itself)."""
    now = time.monotonic()
    if not via.book.through_redis(now):
        return None
    kind, host_id, instance = who
    seq = via.book.next(now)
    try:
        async with asyncio.timeout(via.timeout_s):
            return await via.board.beat(
                kind, host_id, instance, seq, dead_worker_s, registration_ttl_s
            )
    except (*UNAVAILABLE, TimeoutError) as exc:
        logger.warning("heartbeat not written to Redis: %s", exc or "timed out")
        return None


async def accept(
    via: ThroughRedis,
    pool: Pool,
    heard: Heard | None,
    instance: str,
    parse: Callable[[list[Any]], T],
) -> tuple[float, T] | None:
    """When the scheduler has answered the beat just sent or the one before: when that beat
    was sent (the lease's renewal) and what PostgreSQL said of the host then (`parse`d);
    PostgreSQL probed if due, beside the beats. None: the caller beats PostgreSQL itself."""
    if heard is None or heard.answer is None:
        return None
    sent_at = via.book.answered(heard.answer, instance)
    if sent_at is None:
        return None
    try:
        read = parse(heard.answer.read)
    except (KeyError, TypeError, ValueError):
        return None  # an answer from another version of the scheduler
    now = time.monotonic()
    if via.book.probe_due(now) and (via.probing is None or via.probing.done()):
        via.probing = asyncio.create_task(probe(via.book, pool, now))
    return sent_at, read


async def through_redis(
    via: ThroughRedis,
    pool: Pool,
    who: tuple[Kind, str, str],
    parse: Callable[[list[Any]], T],
    dead_worker_s: float = 0.0,
) -> tuple[float, T] | None:
    """`send`, then `accept`."""
    return await accept(via, pool, await send(via, who, dead_worker_s), who[2], parse)


async def probe(book: BeatBook, pool: Pool, sent_at: float) -> None:
    """Whether this service reaches PostgreSQL (a read: no transaction to commit)."""
    try:
        async with pool.acquire() as conn:
            await conn.fetchval("SELECT 1")
    except UNAVAILABLE as exc:
        logger.warning("PostgreSQL not reached: %s", exc)
    else:
        book.reached(sent_at)
