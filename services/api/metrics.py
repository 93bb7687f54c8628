"""Prometheus metrics of the api, in a registry of the app's own (no global registry).

Everything but the submission counter is read at scrape time from the truth: PostgreSQL (jobs
and tasks per state, failed attempts per class, the detection latency histogram, the outbox
backlog, the emergency stop) and
Redis (worker heartbeats). Each is one grouped query, whatever the size of the history.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from services.api import queries
from shared.domain.errors import UNAVAILABLE
from shared.domain.states import FailureClass, JobState, TaskState
from shared.messaging import presence
from shared.messaging.redis_keys import RedisKeys
from shared.operations.pool_status import PoolStatus
from shared.store.db import Connection

logger = logging.getLogger(__name__)

#: Most hosts exported (a fleet is far smaller; the bound keeps a scrape bounded anyway).
MAX_HOSTS: Final = 1000
#: A Redis slower than this to answer is left out of the scrape.
REDIS_TIMEOUT_S: Final = 1.0
BROKER_TIMEOUT_S: Final = 2.0
_EXCHANGES: Final = ("events", "work")
#: Upper bounds (seconds) of the detection latency histogram.
LATENCY_BOUNDS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _DetectionLatency(Collector):
    """`vigil_detection_latency_seconds`: from a failure (a process's death, a limit or error
    record, a worker's death) to the task's failed state, per failure class; refreshed at
    each scrape from `attempts.detected_after_s`."""

    def __init__(self) -> None:
        self.latest: dict[str, queries.Latencies] = {}

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "vigil_detection_latency_seconds",
            "Seconds from a failure to the task's failed state, per failure class",
            labels=["failure_class"],
        )
        for cls, latencies in sorted(self.latest.items()):
            buckets = [(repr(b), n) for b, n in latencies.buckets]
            buckets.append(("+Inf", latencies.count))
            family.add_metric([cls], buckets, latencies.total)
        yield family


class Metrics:
    """Counters updated by the routes, and gauges refreshed from the truth at each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lock = asyncio.Lock()  # one scrape at a time: a scrape clears and refills labels
        self.jobs_submitted = Counter(
            "vigil_api_jobs_submitted",
            "Jobs created through this api process",
            registry=self.registry,
        )
        self.jobs = self._gauge("vigil_jobs", "Jobs per state", "state")
        self.tasks = self._gauge("vigil_tasks", "Tasks per state", "state")
        self.failed_attempts = self._gauge(
            "vigil_attempts_failed", "Attempts that ended with each failure class", "failure_class"
        )
        self.outbox_pending = self._gauge(
            "vigil_outbox_pending",
            "Messages committed but not yet relayed to the broker, per exchange (work: stage"
            " and kill messages on their way to the work queues)",
            "exchange",
        )
        self.heartbeat_age = self._gauge(
            "vigil_host_heartbeat_age_seconds",
            "Seconds since the host's worker last heartbeated: from its Redis registration,"
            " or from PostgreSQL's last record once the registration has expired",
            "host",
        )
        self.registered = self._gauge(
            "vigil_host_worker_registered",
            "1 while the host's worker is registered in Redis (absent: Redis did not answer)",
            "host",
        )
        self.quarantined = self._gauge(
            "vigil_host_quarantined",
            "1 while the host is quarantined (shut or probing: it takes at most one task of"
            " its pool at a time)",
            "host",
        )
        self.probing = self._gauge(
            "vigil_host_probing",
            "1 while the host's breaker lets one task at a time through to probe it",
            "host",
        )
        self.pool_hosts = self._gauge(
            "vigil_pool_hosts",
            "Hosts of the api's worker pool: live (a fresh worker heartbeat), open (live and"
            " taking tasks), probing (live, one task at a time), supervised (a fresh"
            " supervisor heartbeat)",
            "state",
        )
        self.queue_messages = self._gauge(
            "vigil_queue_messages",
            "Messages ready in the broker's queues: pool (new tasks waiting for a worker),"
            " dead_letters (work messages given up after their delivery limit); absent when"
            " the broker does not answer",
            "queue",
        )
        self.dead_letters = Gauge(
            "vigil_dead_letters",
            "Work messages the broker gave up on after their delivery limit, as the schedulers"
            " recorded them with their jobs (all history), read at scrape time",
            registry=self.registry,
        )
        self.outbox_oldest = Gauge(
            "vigil_outbox_oldest_seconds",
            "How long the oldest unpublished outbox row has waited (0: none waits), read at"
            " scrape time",
            registry=self.registry,
        )
        self.scheduler_leading = Gauge(
            "vigil_scheduler_leading",
            "1 while a scheduler holds the leader's lock on the database, read at scrape time",
            registry=self.registry,
        )
        self.detection = _DetectionLatency()
        self.registry.register(self.detection)
        self.emergency_stop = Gauge(
            "vigil_emergency_stop_in_force",
            "1 while an emergency stop is in force",
            registry=self.registry,
        )

    def _gauge(self, name: str, text: str, label: str) -> Gauge:
        return Gauge(name, text + ", read at scrape time", [label], registry=self.registry)

    async def scrape(
        self,
        conn: Connection,
        redis: Redis,
        keys: RedisKeys,
        pool: PoolStatus | None = None,
        queues: Callable[[], Awaitable[dict[str, int]]] | None = None,
    ) -> bytes:
        """Refresh every gauge from PostgreSQL, Redis and the broker and render the text
        exposition. `pool`: the api's worker pool; `queues`: the depths of the queues by
        label.

        A Redis or a broker that does not answer leaves their figures out (logged), never
        fails.
        """
        async with self._lock:
            _fill(self.jobs, await queries.jobs_per_state(conn), [s.value for s in JobState])
            _fill(self.tasks, await queries.tasks_per_state(conn), [s.value for s in TaskState])
            failed = await queries.failed_attempts_per_class(conn)
            _fill(self.failed_attempts, failed, [c.value for c in FailureClass])
            _fill(self.outbox_pending, await queries.outbox_pending(conn), _EXCHANGES)
            self.emergency_stop.set(int(await queries.emergency_stop_in_force(conn)))
            self.detection.latest = await queries.detection_latencies(conn, LATENCY_BOUNDS)
            self.outbox_oldest.set(round(await queries.outbox_oldest_age(conn) or 0.0, 3))
            self.scheduler_leading.set(int(await queries.scheduler_leading(conn)))
            self.dead_letters.set(await queries.dead_letters(conn))
            await self._hosts(conn, redis, keys)
            if pool is not None:
                counts = {
                    "live": pool.live,
                    "open": pool.open,
                    "probing": pool.probing,
                    "supervised": pool.supervised,
                }
                _fill(self.pool_hosts, counts, list(counts))
            self.queue_messages.clear()
            if queues is not None:
                try:
                    async with asyncio.timeout(BROKER_TIMEOUT_S):
                        depths = await queues()
                except Exception as exc:
                    logger.warning("metrics without queue depths (broker: %r)", exc)
                else:
                    for label, depth in depths.items():
                        self.queue_messages.labels(label).set(depth)
            return generate_latest(self.registry)

    async def _hosts(self, conn: Connection, redis: Redis, keys: RedisKeys) -> None:
        ages = await queries.host_heartbeat_ages(conn, MAX_HOSTS)
        self.heartbeat_age.clear()
        self.registered.clear()
        self.quarantined.clear()
        self.probing.clear()
        for host_id, (quarantined, probing) in (
            await queries.host_quarantines(conn, MAX_HOSTS)
        ).items():
            self.quarantined.labels(host_id).set(int(quarantined))
            self.probing.labels(host_id).set(int(probing))
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                live = await presence.heartbeat_ages(redis, keys, sorted(ages))
        except (*UNAVAILABLE, TimeoutError) as exc:
            logger.warning("metrics without worker registrations (Redis: %r)", exc)
            live = None
        for host_id, age in ages.items():
            if live is not None:
                self.registered.labels(host_id).set(int(host_id in live))
                age = live.get(host_id, age)
            self.heartbeat_age.labels(host_id).set(round(age, 3))


def _fill(gauge: Gauge, counts: dict[str, int], labels: list[str] | tuple[str, ...]) -> None:
    """Set one sample per known label (0 when absent) and any other label found."""
    for label in {*labels, *counts}:
        gauge.labels(label).set(counts.get(label, 0))
