"""Rate limits in Redis, shared by every api replica: submission requests per token, and tasks
created per user (`TaskQuota`), whatever the route that creates them.

The bucket is refilled and taken from in one Lua script, with Redis's own clock, so replicas
with skewed clocks agree and two concurrent requests cannot both take the last token. Redis
holds only this ephemeral state: when it does not answer, submissions are let through (with a
warning) rather than refused, since a rate limit is not worth an outage.
"""

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from shared.domain.errors import UNAVAILABLE
from shared.messaging.redis_keys import RedisKeys
from shared.store.users_repo import User, hash_token

logger = logging.getLogger(__name__)

#: A Redis slower than this to answer does not hold a submission up: it is let through.
REDIS_TIMEOUT_S: Final = 0.5

# KEYS[1] the bucket; ARGV rate per second, burst, how many to take. Returns the seconds to
# wait ("0": taken).
_TAKE: Final = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local saved = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(saved[1]) or burst
local since = now - (tonumber(saved[2]) or now)
tokens = math.min(burst, tokens + math.max(0, since) * rate)
local wait = 0
if tokens >= want then
  tokens = tokens - want
else
  wait = (want - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


@dataclass(frozen=True)
class Refused:
    """A submission over the limit: when to retry, and the sentence that says why."""

    retry_after_s: int
    message: str


class SubmitLimiter:
    """Token buckets of `burst` submissions refilled at `rate_per_s`, one per api token."""

    def __init__(self, redis: Redis, keys: RedisKeys, rate_per_s: float, burst: int) -> None:
        self.keys = keys
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._take = redis.register_script(_TAKE)

    async def take(self, token: str) -> Refused | None:
        """Take one submission from the token's bucket: None when allowed, else `Refused`.

        Never raises for an unavailable Redis: the submission is allowed and a warning logged.
        """
        key = self.keys.submit_bucket(hash_token(token)[:32])
        wait = await _wait(self._take, key, self.rate_per_s, self.burst, 1)
        if wait <= 0:
            return None
        retry = max(1, math.ceil(wait))
        return Refused(
            retry,
            f"too many submissions with this token: at most {self.burst} at once and"
            f" {self.rate_per_s:g} per second; retry in {retry} s",
        )


class QuotaExceeded(Exception):
    """A request would create more tasks than its user may now (429, `Retry-After`), or than
    they may at once (`retry_after_s` None: 413, the request must be split)."""

    def __init__(self, message: str, retry_after_s: int | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TaskQuota:
    """Token buckets of `burst` tasks refilled at `rate_per_s`, one per user (all their tokens):
    every route that creates tasks charges what it creates (submission, appended inputs, test
    runs, duplicates one by one or in bulk, activation). Operators are not charged."""

    def __init__(self, redis: Redis, keys: RedisKeys, rate_per_s: float, burst: int) -> None:
        self.keys = keys
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._take = redis.register_script(_TAKE)

    async def charge(self, user: User, tasks: int) -> None:
        """Take `tasks` from the user's bucket; raises `QuotaExceeded` when it holds fewer.

        Called in the transaction that creates them, so a refusal writes nothing. Never
        raises for an unavailable Redis: the tasks are allowed and a warning logged.
        """
        if user.is_operator or tasks <= 0:
            return
        if tasks > self.burst:
            raise QuotaExceeded(
                f"this request would create {tasks} tasks, more than the {self.burst} one user"
                " may create at once (VIGIL_TASK_BURST); split it into smaller ones",
                None,
            )
        key = self.keys.task_bucket(user.id)
        wait = await _wait(self._take, key, self.rate_per_s, self.burst, tasks)
        if wait <= 0:
            return
        retry = max(1, math.ceil(wait))
        raise QuotaExceeded(
            f"too many tasks created by {user.name}: at most {self.burst} at once and"
            f" {self.rate_per_s:g} per second; this request would create {tasks};"
            f" retry in {retry} s",
            retry,
        )


async def _wait(script: AsyncScript, key: str, rate_per_s: float, burst: int, want: int) -> float:
    """Take `want` from the bucket at `key`: the seconds to wait (0: taken). An unavailable
    Redis takes nothing and says 0."""
    try:
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            return float(await script(keys=[key], args=[rate_per_s, burst, want]))
    except (*UNAVAILABLE, TimeoutError, ValueError) as exc:
        logger.warning("rate limit not checked (Redis: %r); allowing it", exc)
        return 0.0
