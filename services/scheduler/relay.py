"""Relaying the outbox to the broker, in order, with publisher confirms.

In order within each kind: events go out in outbox order, and so do work messages, but a work
message does not wait for the events written before it (a batch holds the oldest of each).

Events are numbered as a batch is read (`outbox.pending`): each carries its position in its
body (`seq`). Each event goes out as a message of its own, under its own routing key, with its
body as the outbox holds it and its position in the header `seq` and as its `message_id`: the
events exchange is a public contract (design §7; docs/reference/events.md, "The events
exchange"), read by any AMQP client. What keeps that cheap is the batch: its messages are
written together and their confirms awaited together (`Broker.publish_batch`). A row published
again after a failed publish keeps its position, so after broker trouble positions may arrive
out of order: a consumer that sees a gap fills it from the history (`GET /events?after=`).

A row is deleted from the outbox only after its confirm (an event stays in the history); a row
whose publish failed stays pending and is tried again on the next round (so delivery is
at-least-once: consumers are idempotent). Only the leading scheduler relays, one batch at a
time, with no transaction or row lock held across the publishes: a batch costs one statement,
which reads it and deletes the batch before it (the rows confirmed since), so the delete of the
last batch of a burst rides on the read that finds nothing more. Two leaders at once (the old
one not yet aware it lost) may both publish a row: at-least-once already allows it.

Every row ends deleted, so the relay vacuums the outbox itself every `VACUUM_EVERY` rows it
deleted (`outbox.vacuum`, a few ms): autovacuum's next look may be a minute away, and the
table then held a minute of traffic that each read walked through.
"""

import logging
from collections.abc import Callable
from typing import Final

from services.scheduler import host_queues
from shared.messaging.amqp import Broker, Publish
from shared.messaging.topology import declare_work_queue, host_key, supervise_key
from shared.store import outbox
from shared.store.db import Pool

logger = logging.getLogger(__name__)

#: Rows deleted between two vacuums of the outbox (a few dozen pages of dead rows at most).
VACUUM_EVERY: Final = 10_000


class Relay:
    """Moves pending outbox rows to the events and work exchanges."""

    def __init__(
        self, pool: Pool, broker: Broker, batch: int, *, vacuum_every: int = VACUUM_EVERY
    ) -> None:
        self._pool, self._broker, self._batch = pool, broker, batch
        self._vacuum_every = vacuum_every
        #: Rows deleted since the last vacuum.
        self._deleted = 0
        #: Routing keys of host and supervise queues known to be there (of hosts not retired).
        self._declared: set[str] = set()
        #: Told of every row once it is confirmed (the scheduler follows jobs that may end).
        self.on_published: Callable[[outbox.OutboxRow], None] | None = None
        #: Rows confirmed, to be deleted by the next read.
        self._confirmed: list[int] = []

    @property
    def undeleted(self) -> int:
        """Rows confirmed whose delete has not committed yet."""
        return len(self._confirmed)

    async def run_once(self, *, look_first: bool = False) -> int:
        """Delete what was confirmed since the last call and publish one batch; returns how
        many rows were confirmed. `look_first`: an idle poll (nothing to delete), which most
        often finds nothing: one index probe instead of a read of the batch.

        A call that confirmed rows must be followed by another (the relay loop does so at
        once), or by `drain()`: until then, they are still in the outbox."""
        if look_first and not self._confirmed:
            async with self._pool.acquire() as conn:
                if not await outbox.has_pending(conn):
                    return 0
        async with self._pool.acquire() as conn:
            rows = await outbox.pending(conn, self._batch, confirmed=self._confirmed)
        self._deleted += len(self._confirmed)
        self._confirmed = []  # deleted by that statement (on an error, they are kept)
        if not rows:
            await self._vacuum_if_due()
            return 0
        results = await self._publish(rows)
        self._confirmed = [
            row.id for row, result in zip(rows, results, strict=True) if result is None
        ]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            logger.warning("%d outbox rows not published yet: %s", len(failures), failures[0])
        if self.on_published is not None:
            for row, result in zip(rows, results, strict=True):
                if result is None:
                    self.on_published(row)
        await self._vacuum_if_due()  # after the publishes: they do not wait for it
        return len(self._confirmed)

    async def _vacuum_if_due(self) -> None:
        """Vacuum the outbox once `vacuum_every` rows went; best effort: a vacuum that fails
        is left to the next one (or to autovacuum), never to the relay's publishing."""
        if self._deleted < self._vacuum_every:
            return
        self._deleted = 0
        try:
            async with self._pool.acquire() as conn:
                await outbox.vacuum(conn)
        except Exception as exc:  # an optimisation: whatever went wrong, the relay goes on
            logger.warning("could not vacuum the outbox: %s", exc)

    async def drain(self) -> None:
        """Delete what was confirmed (on the way out); on failure, those rows go out again."""
        if not self._confirmed:
            return
        try:
            async with self._pool.acquire() as conn:
                await outbox.delete_confirmed(conn, self._confirmed)
            self._confirmed = []
        except Exception as exc:  # the rows stay pending and go out again
            logger.warning(
                "could not delete %d published outbox rows: %s", len(self._confirmed), exc
            )

    async def _publish(self, rows: list[outbox.OutboxRow]) -> list[BaseException | None]:
        """Publish the batch in one step (`Broker.publish_batch`), a message a row; what
        became of each row. An event is dropped by the broker if no one listens; a work
        message is `mandatory` (raises if unroutable), sent only once its host queue is
        declared."""
        results: list[BaseException | None] = [None] * len(rows)
        messages: list[Publish] = []
        sent: list[int] = []  # the row of each message
        broker = self._broker
        for n, row in enumerate(rows):
            if row.exchange == "events":
                messages.append(Publish(broker.events, row.routing_key, row.body, False, row.seq))
            else:
                try:
                    if not await self._ensure_queue(row.routing_key):
                        continue  # a retired host's: dropped, counted as confirmed
                except Exception as exc:  # this row waits for the next round; the rest go
                    results[n] = exc
                    continue
                messages.append(Publish(broker.work, row.routing_key, row.body, True))
            sent.append(n)
        try:
            outcomes = await broker.publish_batch(messages)
        except Exception as exc:  # none was sent: every row waits for the next round
            return [exc] * len(rows)
        for n, outcome in zip(sent, outcomes, strict=True):
            results[n] = outcome
        return results

    async def _ensure_queue(self, routing_key: str) -> bool:
        """Declare the host queue a work message is for, so it is never dropped unrouted;
        False for a message to a retired host (`host_queues`), its work or supervise queue:
        that queue stays deleted and the message goes nowhere, as what it carried is the
        database's (its task resolved or placed again, a kill owed kept in `attempts`)."""
        kind, _, host_id = routing_key.partition(".")
        if routing_key in self._declared or kind not in ("host", "supervise"):
            return True
        async with self._pool.acquire() as conn:
            if await host_queues.is_retired(conn, host_id):
                logger.info("%s message for retired host %s dropped", kind, host_id)
                return False
        if kind == "host":  # a supervise queue is its supervisor's to declare, at its start
            topology = self._broker.topology
            await declare_work_queue(
                self._broker.channel, topology, topology.host_queue(host_id), routing_key
            )
        self._declared.add(routing_key)
        return True

    def forget_host(self, host_id: str) -> None:
        """The host's queues were deleted: its next message looks again."""
        self._declared -= {host_key(host_id), supervise_key(host_id)}
