"""Every exchange and queue name, and the one place they are declared (idempotently).

All names are prefixed by `VIGIL_NAMESPACE` so that installations and test runs can share a
broker. Queues are durable quorum queues dead-lettering to one DLQ after `DELIVERY_LIMIT`
deliveries; each is declared only here, with one set of arguments (design §10: a re-declaration
with other arguments closes the channel).
"""

import logging
from dataclasses import dataclass
from typing import Any, Final

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from shared.domain.ids import is_safe_id
from shared.runtime.config import DEFAULT_POOL

logger = logging.getLogger(__name__)

#: Poison messages go to the DLQ after this many deliveries (quorum queues need it explicit).
DELIVERY_LIMIT: Final = 5


@dataclass(frozen=True)
class Topology:
    """The names of one installation's exchanges and queues."""

    namespace: str = ""

    def _name(self, *parts: str) -> str:
        prefix = (self.namespace + ".") if self.namespace else ""
        return prefix + "vigil." + ".".join(parts)

    @property
    def events_exchange(self) -> str:
        """Topic exchange of `log.*.*`, `job.*.*` and `task.*.*` events."""
        return self._name("events")

    @property
    def work_exchange(self) -> str:
        """Direct exchange that routes stage messages to pool and host queues."""
        return self._name("work")

    @property
    def dead_letter_exchange(self) -> str:
        return self._name("dlx")

    @property
    def dead_letter_queue(self) -> str:
        return self._name("dlq")

    def pool_queue(self, pool: str = DEFAULT_POOL) -> str:
        """Queue of setup work that any worker of `pool` may take."""
        return self._name("work", "pool", _safe(pool))

    def host_queue(self, host_id: str) -> str:
        """Queue of work that must run on `host_id` (its work dirs are there)."""
        return self._name("work", "host", _safe(host_id))

    def supervisor_queue(self, host_id: str) -> str:
        """Queue of processes handed by the worker of `host_id` to its supervisor."""
        return self._name("supervise", _safe(host_id))

    def error_log_queue(self, host_id: str, instance: str) -> str:
        """Exclusive queue of a supervisor instance: error-log records of the jobs it watches."""
        return self._name("errors", _safe(host_id), _safe(instance))

    @property
    def signer_queue(self) -> str:
        """Queue of the requests of hosts to the store's signer (`shared/messaging/signing.py`)."""
        return self._name("sign")

    def follower_queue(self, follower_id: str) -> str:
        """Exclusive queue of one live event stream (an SSE client of the api)."""
        return self._name("follow", _safe(follower_id))


def pool_key(pool: str = DEFAULT_POOL) -> str:
    """Routing key on the work exchange for a pool queue."""
    return "pool." + _safe(pool)


def host_key(host_id: str) -> str:
    """Routing key on the work exchange for a host queue."""
    return "host." + _safe(host_id)


def supervise_key(host_id: str) -> str:
    """Routing key on the work exchange for a supervisor queue."""
    return "supervise." + _safe(host_id)


def event_key(kind: str, what: str, job_id: str) -> str:
    """`<kind>.<what>.<job id>`, e.g. `task.on_cpu.j-...`; every part must be a safe id word."""
    for part in (kind, what, job_id):
        if not is_safe_id(part.replace("_", "-")):
            raise ValueError(f"unsafe routing key part {part!r}")
    return f"{kind}.{what}.{job_id}"


def _safe(part: str) -> str:
    if not is_safe_id(part):
        raise ValueError(f"unsafe name part {part!r}")
    return part


def _queue_arguments(topology: Topology) -> dict[str, Any]:
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": DELIVERY_LIMIT,
        "x-dead-letter-exchange": topology.dead_letter_exchange,
    }


async def declare_events_exchange(channel: AbstractChannel, topology: Topology) -> AbstractExchange:
    """Declare the topic exchange of events (alone: for followers, who need nothing else)."""
    return await channel.declare_exchange(
        topology.events_exchange, aio_pika.ExchangeType.TOPIC, durable=True
    )


async def declare_exchanges(
    channel: AbstractChannel, topology: Topology
) -> tuple[AbstractExchange, AbstractExchange]:
    """Declare the events, work and dead-letter exchanges and the DLQ; returns (events, work)."""
    events = await declare_events_exchange(channel, topology)
    work = await channel.declare_exchange(
        topology.work_exchange, aio_pika.ExchangeType.DIRECT, durable=True
    )
    dlx = await channel.declare_exchange(
        topology.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
    )
    dlq = await channel.declare_queue(
        topology.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
    )
    await dlq.bind(dlx)
    return events, work


async def declare_work_queue(
    channel: AbstractChannel, topology: Topology, name: str, routing_key: str
) -> AbstractQueue:
    """Declare a durable quorum work queue bound to the work exchange under `routing_key`."""
    queue = await channel.declare_queue(name, durable=True, arguments=_queue_arguments(topology))
    await queue.bind(topology.work_exchange, routing_key)
    return queue


#: A follower's queue keeps at most this many messages; a stalled client loses the oldest.
FOLLOWER_MAX_LENGTH: Final = 10_000


async def declare_follower_queue(
    channel: AbstractChannel, topology: Topology, name: str, patterns: list[str]
) -> AbstractQueue:
    """Declare a follower's queue bound to the events exchange under each of `patterns`.

    A classic queue (never quorum: it is exclusive and short-lived), non-durable, exclusive to
    the connection and auto-deleted when its consumer goes; bounded by `FOLLOWER_MAX_LENGTH`.
    `patterns` must be checked beforehand (`shared.domain.topics`).
    """
    queue = await channel.declare_queue(
        name,
        durable=False,
        exclusive=True,
        auto_delete=True,
        arguments={
            "x-queue-type": "classic",
            "x-max-length": FOLLOWER_MAX_LENGTH,
            "x-overflow": "drop-head",
        },
    )
    for pattern in patterns:
        await queue.bind(topology.events_exchange, pattern)
    return queue


async def declare_error_log_queue(channel: AbstractChannel, name: str) -> AbstractQueue:
    """Declare a supervisor's error-log queue: classic, non-durable, exclusive, auto-deleted
    (it is bound and unbound to `log.<severity>.<job id>` as jobs come and go)."""
    return await channel.declare_queue(
        name,
        durable=False,
        exclusive=True,
        auto_delete=True,
        arguments={"x-queue-type": "classic"},
    )


async def declare_all_work_queues(
    channel: AbstractChannel, topology: Topology, host_id: str, pool: str = DEFAULT_POOL
) -> tuple[AbstractQueue, AbstractQueue, AbstractQueue]:
    """Declare the pool, host and supervisor queues of `host_id`: (pool, host, supervisor)."""
    await declare_exchanges(channel, topology)
    pool_q = await declare_work_queue(channel, topology, topology.pool_queue(pool), pool_key(pool))
    host_q = await declare_work_queue(
        channel, topology, topology.host_queue(host_id), host_key(host_id)
    )
    sup_q = await declare_work_queue(
        channel, topology, topology.supervisor_queue(host_id), supervise_key(host_id)
    )
    return pool_q, host_q, sup_q


async def delete_all(
    channel: AbstractChannel, topology: Topology, host_ids: list[str], pool: str = DEFAULT_POOL
) -> None:
    """Delete an installation's queues (those of `host_ids` and `pool`) and exchanges.

    For tearing down a namespace (tests, uninstall). Messages in the queues are lost.
    """
    queues = [topology.pool_queue(pool), topology.dead_letter_queue, topology.signer_queue]
    for host_id in host_ids:
        queues += [topology.host_queue(host_id), topology.supervisor_queue(host_id)]
    for queue in queues:
        # Quorum queues refuse if_unused=True by closing the connection (design §10).
        await channel.queue_delete(queue, if_unused=False, if_empty=False)
    for exchange in (
        topology.events_exchange,
        topology.work_exchange,
        topology.dead_letter_exchange,
    ):
        await channel.exchange_delete(exchange)


async def delete_host_queues(channel: AbstractChannel, topology: Topology, host_id: str) -> int:
    """Delete the work and supervise queues of a retired host; how many messages they held.

    Idempotent: a queue already gone is no error (RabbitMQ's delete of a missing queue succeeds).
    Called once nothing in them is owed (`services/scheduler/host_queues.py`): what is left are
    messages of tasks the database already resolved or placed again, so they are dropped. A
    host that comes back under the same id declares them again at its start.
    """
    dropped = 0
    for queue in (topology.host_queue(host_id), topology.supervisor_queue(host_id)):
        # Quorum queues refuse if_unused=True by closing the connection (design §10).
        result = await channel.queue_delete(queue, if_unused=False, if_empty=False)
        dropped += result.message_count or 0
    logger.info(
        "host %s retired: its work and supervise queues deleted (%d message(s) dropped)",
        host_id,
        dropped,
        extra={"host": host_id},
    )
    return dropped
