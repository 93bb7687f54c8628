"""The supervisor's subscription to `log.<severity>.<job id>` for the jobs it watches.

One exclusive, auto-deleted queue per supervisor; a job's bindings (one per severity in its
`fail_on_log`) are added when its first task is watched and removed with its last. Following
is best effort: if the broker is away, the worker still fails the task on its error log when
the command exits, and the watcher reads already-persisted errors from PostgreSQL on start.
"""

import logging
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from shared.domain.errors import InvalidMessage
from shared.domain.messages import LogRecord, Severity, decode
from shared.messaging.amqp import Broker, settle
from shared.messaging.topology import declare_error_log_queue, event_key

logger = logging.getLogger(__name__)

OnRecord = Callable[[LogRecord], Awaitable[None]]


class ErrorLogs:
    """Bindings of the supervisor's log queue, counted per job."""

    def __init__(self) -> None:
        self._queue: AbstractQueue | None = None
        self._exchange = ""
        self._keys: dict[str, list[str]] = {}
        self._count: dict[str, int] = {}

    async def start(self, broker: Broker, queue_name: str, on_record: OnRecord) -> None:
        """Declare the queue and consume it with `on_record`."""
        channel = await broker.channel_for_consuming(prefetch=64)
        self._queue = await declare_error_log_queue(channel, queue_name)
        self._exchange = broker.topology.events_exchange

        async def on_message(incoming: AbstractIncomingMessage) -> None:
            try:
                message = decode(incoming.body)
                if isinstance(message, LogRecord):
                    await on_record(message)
            except InvalidMessage as exc:
                logger.warning("ignoring an undecodable log record: %s", exc)
            except Exception:
                logger.exception("could not handle a log record")
            await settle(incoming, ack=True)

        await self._queue.consume(on_message)

    async def follow(self, job_id: str, severities: list[Severity]) -> None:
        """Receive the job's records of `severities` (counted: one call per watched task)."""
        self._count[job_id] = self._count.get(job_id, 0) + 1
        if self._count[job_id] > 1 or self._queue is None:
            return
        keys = [event_key("log", s.value, job_id) for s in severities]
        self._keys[job_id] = keys
        for key in keys:
            try:
                await self._queue.bind(self._exchange, key)
            except Exception as exc:  # best effort, see the module docstring
                logger.warning("cannot bind %s: %s", key, exc)

    async def unfollow(self, job_id: str) -> None:
        """Undo one `follow`; the last one removes the job's bindings."""
        left = self._count.get(job_id, 0) - 1
        if left > 0:
            self._count[job_id] = left
            return
        self._count.pop(job_id, None)
        for key in self._keys.pop(job_id, []):
            if self._queue is None:
                break
            try:
                await self._queue.unbind(self._exchange, key)
            except Exception as exc:
                logger.warning("cannot unbind %s: %s", key, exc)
