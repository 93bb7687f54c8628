"""Workers nudge the relay through Redis, not PostgreSQL.

The events of a task's normal path notify nobody when they are written (their moves would
each take PostgreSQL's notification lock at commit); the relay polls for them, quickly only
while it heard from the system lately, so a worker nudges it after such a commit, at most
every `NUDGE_EVERY_S` (`shared/store/transition_writer.py`). A nudge was a `NOTIFY` of its own:
a transaction a busy host made twice a second, two thousand a second for a thousand hosts, on
the one database. Now a worker publishes on a Redis channel (`RedisKeys.relay_nudges`) and
every scheduler listens to it (`listen`): a nudge costs PostgreSQL nothing. A nudge is as best
effort as it was: one lost (Redis away, a scheduler between two subscriptions) leaves the
events to the relay's next poll.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from redis.asyncio import Redis

from shared.domain.errors import UNAVAILABLE
from shared.runtime.lifecycle import wait_or_stop

logger = logging.getLogger(__name__)

#: The pause after Redis did not answer, before listening again.
PAUSE_S: Final = 1.0
#: How long one look for a nudge waits (the listener sees `stop` this often).
LOOK_S: Final = 1.0


async def nudge(redis: Redis, channel: str) -> None:
    """Nudge the relay: one `PUBLISH`."""
    await redis.publish(channel, "relay")


async def listen(
    redis: Redis, channel: str, heard: Callable[[], None], stop: asyncio.Event
) -> None:
    """Call `heard` for every nudge on `channel` until `stop`; listen again after Redis comes
    back."""
    while not stop.is_set():
        try:
            async with redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(channel)
                while not stop.is_set():
                    if await pubsub.get_message(timeout=LOOK_S) is not None:
                        heard()
        except UNAVAILABLE as exc:
            logger.warning("cannot listen for relay nudges yet: %s", exc)
            await wait_or_stop(stop, PAUSE_S)
