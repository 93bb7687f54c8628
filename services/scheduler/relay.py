"""Relaying the outbox to the broker, in order, with publisher confirms.

A row is marked published only after its confirm; a row whose publish failed stays pending and
is tried again on the next round (so delivery is at-least-once: consumers are idempotent).
Only the leading scheduler relays, one batch at a time, so a batch is read and marked in two
statements of their own, with no transaction or row lock held across the publishes (four
round trips a batch before), and the mark is not waited for. Two leaders at once (the old one
not yet aware it lost) may both publish a row: at-least-once already allows it.
"""

import asyncio
import json
import logging
from collections.abc import Callable

from shared import outbox
from shared.amqp import Broker
from shared.db import Pool
from shared.topology import declare_work_queue

logger = logging.getLogger(__name__)


class Relay:
    """Moves pending outbox rows to the events and work exchanges."""

    def __init__(self, pool: Pool, broker: Broker, batch: int) -> None:
        self._pool, self._broker, self._batch = pool, broker, batch
        self._declared: set[str] = set()
        #: Told of every row once it is confirmed (the scheduler follows jobs that may end).
        self.on_published: Callable[[outbox.OutboxRow], None] | None = None
        #: Rows confirmed whose mark has not committed yet: never read again meanwhile.
        self._marking: set[int] = set()
        self._marks: set[asyncio.Task[None]] = set()

    async def run_once(self, *, look_first: bool = False) -> int:
        """Publish one batch; returns how many rows were confirmed. `look_first`: an idle poll,
        which most often finds nothing: one index probe instead of a read of the batch.

        The batch's mark (`published_at`) is written in the background: the next batch need
        not wait for its commit, and skips the rows it names until then. A mark that fails
        leaves its rows pending: they are published again (at-least-once)."""
        if look_first:
            async with self._pool.acquire() as conn:
                if not await outbox.has_pending(conn):
                    return 0
        async with self._pool.acquire() as conn:
            rows = await outbox.pending(conn, self._batch, skip=sorted(self._marking))
        if not rows:
            return 0
        results = await asyncio.gather(
            *(self._publish(row) for row in rows), return_exceptions=True
        )
        done = [row.id for row, result in zip(rows, results, strict=True) if result is None]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            logger.warning("%d outbox rows not published yet: %s", len(failures), failures[0])
        if done:
            self._marking.update(done)
            mark = asyncio.create_task(self._mark(done), name="relay-mark")
            self._marks.add(mark)
            mark.add_done_callback(self._marks.discard)
        if self.on_published is not None:
            for row, result in zip(rows, results, strict=True):
                if result is None:
                    self.on_published(row)
        return len(done)

    async def _mark(self, ids: list[int]) -> None:
        try:
            async with self._pool.acquire() as conn:
                await outbox.mark_published(conn, ids)
        except Exception as exc:  # the rows stay pending and go out again
            logger.warning("could not mark %d published outbox rows: %s", len(ids), exc)
        finally:
            self._marking.difference_update(ids)

    async def drain(self) -> None:
        """Wait for the marks under way (on the way out)."""
        await asyncio.gather(*self._marks, return_exceptions=True)

    async def _publish(self, row: outbox.OutboxRow) -> None:
        body = _json_bytes(row.body)
        if row.exchange == "events":
            await self._broker.publish(self._broker.events, row.routing_key, body, mandatory=False)
            return
        await self._ensure_queue(row.routing_key)
        await self._broker.publish(self._broker.work, row.routing_key, body, mandatory=True)

    async def _ensure_queue(self, routing_key: str) -> None:
        """Declare the host queue a work message is for, so it is never dropped unrouted."""
        if routing_key in self._declared or not routing_key.startswith("host."):
            return
        host_id = routing_key.removeprefix("host.")
        topology = self._broker.topology
        await declare_work_queue(
            self._broker.channel, topology, topology.host_queue(host_id), routing_key
        )
        self._declared.add(routing_key)


def _json_bytes(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
