"""Heartbeats through Redis: both sides of the board, written and read here.

A host's service pushes its beat on the `beats` list (`<kind>:<host> <instance> <seq>
<dead_worker_s> <Redis time>`: Redis stamps it, so that every age is read on one clock) and
reads, in the same round trip, its answer in the `answers` hash (field `<kind>:<host>`): the
beat the leading scheduler last wrote into PostgreSQL for it, and what PostgreSQL said of the
host then. A worker's beat also refreshes its registration's TTL (`presence.py`) in that
round trip. The scheduler takes the list whole in one round trip (`BeatBoard.take`: each beat
is read once), writes the beats into `hosts` in one transaction, and answers them
(`BeatBoard.answer`).

Redis holds only beats and answers: PostgreSQL stays the one record of who lives
(`hosts.heartbeat_at`), written in bulk.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, cast

from redis.asyncio import Redis

from shared.messaging.redis_keys import RedisKeys

#: The most beats the list holds: with no scheduler taking them, beats stop being pushed (and
#: go unanswered: their services beat PostgreSQL themselves).
MOST_WAITING: Final = 100_000


class Kind(StrEnum):
    """Whose beat: a host's worker or its supervisor."""

    WORKER = "w"
    SUPERVISOR = "s"


@dataclass(frozen=True)
class Beat:
    """A beat as the scheduler reads it: whose, which of the service's beats (`seq`), its
    supervisor's `dead_worker_s` (0 for a worker), and how long ago it reached Redis."""

    #: `<kind>:<host>`: the service's field in the answers.
    field: str
    kind: Kind
    host_id: str
    instance: str
    seq: int
    dead_worker_s: float
    age_s: float


@dataclass(frozen=True)
class Answer:
    """What the scheduler answered a service: the beat of its it wrote into PostgreSQL
    (`instance`, `seq`), and what PostgreSQL said of the host then (the fields of
    `hosts_repo.WorkerBeat` or `SupervisorBeat`, in order)."""

    instance: str
    seq: int
    read: list[Any]

    def encode(self) -> str:
        return json.dumps([self.instance, self.seq, self.read], separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | None) -> "Answer | None":
        """The answer, or None for none or one this version cannot read."""
        if raw is None:
            return None
        try:
            instance, seq, read = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(instance, str) or not isinstance(seq, int) or not isinstance(read, list):
            return None
        return cls(instance, seq, read)


@dataclass(frozen=True)
class Heard:
    """What a beat heard back: the scheduler's last answer (None: none yet), and whether the
    worker's registration was still there to refresh (always True for a supervisor)."""

    answer: Answer | None
    registered: bool = True


def field_of(kind: Kind, host_id: str) -> str:
    return f"{kind.value}:{host_id}"


# KEYS: beats, answers, and a worker's registration; ARGV: field, "<instance> <seq>
# <dead_worker_s>", the most beats waiting, the registration's TTL. Scripts may call TIME since
# Redis 5 (effects are replicated, not the script).
_BEAT: Final = """
local registered = 1
if KEYS[3] then registered = redis.call('EXPIRE', KEYS[3], ARGV[4]) end
if redis.call('LLEN', KEYS[1]) < tonumber(ARGV[3]) then
  local t = redis.call('TIME')
  redis.call('RPUSH', KEYS[1],
    ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. t[1] .. '.' .. string.format('%06d', t[2]))
end
return {redis.call('HGET', KEYS[2], ARGV[1]), registered}
"""

# KEYS: beats. Returns Redis' time and every beat, taken off the list.
_TAKE: Final = """
local t = redis.call('TIME')
local beats = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return {t[1] .. '.' .. string.format('%06d', t[2]), beats}
"""


class BeatBoard:
    """The beats and answers of one installation."""

    def __init__(self, redis: Redis, keys: RedisKeys) -> None:
        self._redis, self._keys = redis, keys
        self._beats, self._answers = keys.beats(), keys.beat_answers()
        self._beat = redis.register_script(_BEAT)
        self._take = redis.register_script(_TAKE)

    async def beat(
        self,
        kind: Kind,
        host_id: str,
        instance: str,
        seq: int,
        dead_worker_s: float = 0.0,
        registration_ttl_s: int | None = None,
    ) -> Heard:
        """A service's beat (a worker's also refreshes its registration for
        `registration_ttl_s`); the scheduler's last answer to it."""
        keys = [self._beats, self._answers]
        if registration_ttl_s is not None:
            keys.append(self._keys.worker(host_id))
        answer, registered = cast(
            list[Any],
            await self._beat(
                keys=keys,
                args=[
                    field_of(kind, host_id),
                    f"{instance} {seq} {dead_worker_s!r}",
                    MOST_WAITING,
                    registration_ttl_s or 0,
                ],
            ),
        )
        return Heard(Answer.decode(answer), bool(registered))

    async def take(self) -> list[Beat]:
        """Every beat pushed since the last take, with its age on Redis' clock (a value this
        version cannot read is left out)."""
        now_raw, values = cast(list[Any], await self._take(keys=[self._beats]))
        now = float(now_raw)
        beats = []
        for value in values:
            beat = _parse(value, now)
            if beat is not None:
                beats.append(beat)
        return beats

    async def answer(self, answers: Mapping[str, Answer]) -> None:
        """Answer the services whose beats were written into PostgreSQL (by field)."""
        if answers:
            mapping = {field: answer.encode() for field, answer in answers.items()}
            await self._redis.hset(self._answers, mapping=cast(Any, mapping))

    async def answered(self) -> list[str]:
        """The fields with an answer."""
        return [str(field) for field in await self._redis.hkeys(self._answers)]

    async def forget(self, fields: Iterable[str]) -> None:
        """Drop these services' answers (hosts gone for good)."""
        listed = list(fields)
        if listed:
            await self._redis.hdel(self._answers, *listed)


def _parse(value: str, now: float) -> Beat | None:
    try:
        field, instance, seq, dead_worker_s, at = value.split(" ")
        kind, host_id = field.split(":", 1)
        return Beat(
            field, Kind(kind), host_id, instance, int(seq), float(dead_worker_s), now - float(at)
        )
    except ValueError:
        return None
