"""Per-token rate limit on submissions: a token bucket in Redis, shared by every api replica.

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

from shared.errors import UNAVAILABLE
from shared.redis_keys import RedisKeys
from shared.users_repo import hash_token

logger = logging.getLogger(__name__)

#: A Redis slower than this to answer does not hold a submission up: it is let through.
REDIS_TIMEOUT_S: Final = 0.5

# KEYS[1] the bucket; ARGV rate per second, burst. Returns the seconds to wait ("0": taken).
_TAKE: Final = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local saved = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(saved[1]) or burst
local since = now - (tonumber(saved[2]) or now)
tokens = math.min(burst, tokens + math.max(0, since) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
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
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                wait = float(await self._take(keys=[key], args=[self.rate_per_s, self.burst]))
        except (*UNAVAILABLE, TimeoutError, ValueError) as exc:
            logger.warning("submission rate limit not checked (Redis: %r); allowing it", exc)
            return None
        if wait <= 0:
            return None
        retry = max(1, math.ceil(wait))
        return Refused(
            retry,
            f"too many submissions with this token: at most {self.burst} at once and"
            f" {self.rate_per_s:g} per second; retry in {retry} s",
        )
