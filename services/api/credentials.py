"""Whom a token belongs to, remembered by the api for a few seconds.

Every request named its caller with a statement of its own (the token's hash looked up with
its user): a round trip and a pool borrowing a request, a tenth of the api's CPU under W1.
`Credentials` remembers a valid token's holder for `REMEMBER_S` (never past the token's own
expiry) while it listens for changes of the tokens and the users (channel
`vigil_credentials`, migration 0041):

- a notification empties the memory: a revocation, a disabled user, a role changed, through
  any api, `vigil-admin` or by hand in SQL, is seen by every api once its notification
  arrives (sent at the change's commit); this api's own revocations forget at once
  (`forget`);
- while the api does not listen (at its start, once its listening connection is lost, until
  it listens again) it remembers nothing: every request reads;
- a lookup that read before a change and ends after its notification is not kept (the
  memory's generation moved meanwhile);
- a refusal is never remembered: a token made a moment ago works at once;
- `REMEMBER_S` bounds what a listening connection cut off without an error yet could let
  through.
"""

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Final

import asyncpg

from shared.domain.errors import UNAVAILABLE
from shared.store import db, users_repo
from shared.store.db import Pool
from shared.store.users_repo import User

logger = logging.getLogger(__name__)

#: The channel migration 0041's triggers notify on.
CHANNEL: Final = "vigil_credentials"
#: How long a holder is remembered at most.
REMEMBER_S: Final = 5.0
#: How many tokens are remembered at most (the least recently used go first).
MOST: Final = 10_000
#: The pause before listening again after the database was away.
RETRY_S: Final = 1.0


class Credentials:
    """The holders of tokens seen lately, kept only while changes are listened for."""

    def __init__(
        self,
        remember_s: float = REMEMBER_S,
        most: int = MOST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._remember_s = remember_s
        self._most = most
        self._clock = clock
        #: token hash -> (holder, until when by `clock`)
        self._known: OrderedDict[str, tuple[User, float]] = OrderedDict()
        self._generation = 0
        self._listening = False
        self._changed = asyncio.Event()
        #: Lookups answered from memory (for tests and benchmarks).
        self.hits = 0

    @property
    def listening(self) -> bool:
        """Whether changes are listened for (and holders therefore remembered)."""
        return self._listening

    @property
    def generation(self) -> int:
        """How many times the memory was emptied."""
        return self._generation

    def forget(self) -> None:
        """Empty the memory; a lookup under way is not kept."""
        self._known.clear()
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, after: int) -> None:
        """Return once the memory was emptied since generation `after`."""
        while self._generation == after:
            await self._changed.wait()

    async def holder(self, pool: Pool, token: str) -> User | None:
        """The user holding `token` while it is valid, or None."""
        hashed = users_repo.hash_token(token)
        known = self._known.get(hashed)
        started = self._clock()
        if known is not None:
            if started < known[1]:
                self._known.move_to_end(hashed)
                self.hits += 1
                return known[0]
            del self._known[hashed]
        generation = self._generation
        found = await db.read(pool, lambda conn: users_repo.holder(conn, hashed))
        if found is None:
            return None
        if self._listening and generation == self._generation:
            kept = self._remember_s
            if found.expires_in_s is not None:
                kept = min(kept, found.expires_in_s)
            self._known[hashed] = (found.user, started + kept)
            if len(self._known) > self._most:
                self._known.popitem(last=False)
        return found.user

    def _notified(self, *_: Any) -> None:
        self.forget()

    async def _listen_on(self, conn: "asyncpg.Connection[asyncpg.Record]") -> None:
        """Listen on `conn` until it is lost."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(CHANNEL, self._notified)
        # what was read before the LISTEN took effect may be stale: not kept
        self.forget()
        self._listening = True
        while not lost.is_set() and not conn.is_closed():
            with suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), RETRY_S)
        logger.warning("lost the connection listening for token changes")

    async def listen(self, dsn: str) -> None:
        """Listen for changes until cancelled, on a connection of its own; listen again
        whenever it is lost. Nothing is remembered while not listening."""
        while True:
            try:
                conn = await asyncpg.connect(dsn)
            except UNAVAILABLE as exc:
                logger.warning("cannot listen for token changes yet: %s", exc)
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await self._listen_on(conn)
            except UNAVAILABLE as exc:
                logger.warning("stopped listening for token changes: %s", exc)
            finally:
                self._listening = False
                self.forget()
                if not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(RETRY_S)


@asynccontextmanager
async def listening(dsn: str, **options: Any) -> AsyncIterator[Credentials]:
    """`Credentials` listening on `dsn` for as long as the block runs."""
    credentials = Credentials(**options)
    task = asyncio.create_task(credentials.listen(dsn), name="credentials")
    try:
        yield credentials
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
