"""Heartbeats through Redis (issue 41): both sides of the two hashes, written and read here.

A host's service writes its beat in the `beats` hash (field `<kind>:<host>`, value
`<instance> <seq> <dead_worker_s> <Redis time>`: Redis stamps it, so that every age is read on
one clock) and reads, in the same round trip, its answer in the `answers` hash: the beat the
leading scheduler last wrote into PostgreSQL for it, and what PostgreSQL said of the host
then. The scheduler reads every beat in one round trip (`BeatBoard.read`), writes the new ones
into `hosts` in one transaction, and answers them (`BeatBoard.answer`).

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

#: A beat older than this is forgotten, with its answer (a host gone for good).
FORGET_AFTER_S: Final = 600.0


class Kind(StrEnum):
    """Whose beat: a host's worker or its supervisor."""

    WORKER = "w"
    SUPERVISOR = "s"


@dataclass(frozen=True)
class Beat:
    """A beat as the scheduler reads it: whose, which of the service's beats (`seq`), its
    supervisor's `dead_worker_s` (0 for a worker), and how long ago it reached Redis."""

    kind: Kind
    host_id: str
    instance: str
    seq: int
    dead_worker_s: float
    age_s: float

    @property
    def field(self) -> str:
        return field_of(self.kind, self.host_id)


@dataclass(frozen=True)
class Answer:
    """What the scheduler answered a service: the beat of its it wrote into PostgreSQL
    (`instance`, `seq`), and what PostgreSQL said of the host then (`hosts_repo`'s beat
    fields, by name)."""

    instance: str
    seq: int
    read: dict[str, Any]

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
        if not isinstance(instance, str) or not isinstance(seq, int) or not isinstance(read, dict):
            return None
        return cls(instance, seq, read)


def field_of(kind: Kind, host_id: str) -> str:
    return f"{kind.value}:{host_id}"


# KEYS: beats, answers; ARGV: field, "<instance> <seq> <dead_worker_s>". Scripts may call TIME
# since Redis 5 (effects are replicated, not the script).
_BEAT: Final = """
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. t[1] .. '.' .. string.format('%06d', t[2]))
return redis.call('HGET', KEYS[2], ARGV[1])
"""

# KEYS: beats. Returns Redis' time and every beat.
_READ: Final = """
local t = redis.call('TIME')
return {t[1] .. '.' .. string.format('%06d', t[2]), redis.call('HGETALL', KEYS[1])}
"""


class BeatBoard:
    """The beats and answers of one installation."""

    def __init__(self, redis: Redis, keys: RedisKeys) -> None:
        self._redis = redis
        self._beats, self._answers = keys.beats(), keys.beat_answers()
        self._beat = redis.register_script(_BEAT)
        self._read = redis.register_script(_READ)

    async def beat(
        self, kind: Kind, host_id: str, instance: str, seq: int, dead_worker_s: float = 0.0
    ) -> Answer | None:
        """A service's beat; the scheduler's last answer to it (None: none yet)."""
        raw = await self._beat(
            keys=[self._beats, self._answers],
            args=[field_of(kind, host_id), f"{instance} {seq} {dead_worker_s!r}"],
        )
        return Answer.decode(cast(str | None, raw))

    async def read(self) -> list[Beat]:
        """Every beat on the board, with its age on Redis' clock. A value this version cannot
        read is left out."""
        now_raw, flat = cast(list[Any], await self._read(keys=[self._beats]))
        now = float(now_raw)
        beats = []
        for field, value in zip(flat[::2], flat[1::2], strict=True):
            beat = _parse(field, value, now)
            if beat is not None:
                beats.append(beat)
        return beats

    async def answer(self, answers: Mapping[str, Answer]) -> None:
        """Answer the services whose beats were written into PostgreSQL (by field)."""
        if answers:
            mapping = {field: answer.encode() for field, answer in answers.items()}
            await self._redis.hset(self._answers, mapping=cast(Any, mapping))

    async def forget(self, fields: Iterable[str]) -> None:
        """Drop these services' beats and answers (hosts long gone, or a service that stopped:
        its last beat must not be written again)."""
        listed = list(fields)
        if listed:
            pipe = self._redis.pipeline(transaction=False)
            pipe.hdel(self._beats, *listed)
            pipe.hdel(self._answers, *listed)
            await pipe.execute()


def _parse(field: str, value: str, now: float) -> Beat | None:
    try:
        kind, host_id = field.split(":", 1)
        instance, seq, dead_worker_s, at = value.split(" ")
        return Beat(Kind(kind), host_id, instance, int(seq), float(dead_worker_s), now - float(at))
    except ValueError:
        return None
