"""The scheduler service: lead, then two loops: one triages failures, releases tasks, ends jobs
and reaps hosts; the other relays the outbox to the broker.

Both wake on outbox inserts (LISTEN `vigil_outbox`: not for the events of a task's normal path
on its worker, migration 0012; the relay alone for work messages and a job's end, 0014; the
round for a job made active or throttled and a claim given back, 0018; the relay alone for
`task.new`, the round for tasks added, unless their submission released them, 0027; a
task's terminal event names its job, 0030: the relay, and the round, whose finaliser looks at
the job at once, and the dispatcher and the waiters if tasks wait; the relay for a worker's
nudge). The relay also polls every `relay_poll_s` while it heard from the system lately,
every 2 s after a quiet spell (`due.relay_wait`); the round runs every tick while busy and,
idle, waits twice as long each time up to the sweep's 2 s (`due.Pace`), woken sooner for a
resubmission's backoff or any event the relay publishes. The relay also tells the triage of
failures, the finaliser of triage decisions and of cancelled jobs (`due.py`), and wakes the
round.
"""

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Final

import asyncpg
from redis.asyncio import Redis

from services.scheduler import beat_relay, breaker, dead_letters, pilots, pruning, statistics
from services.scheduler import health as scheduler_health
from services.scheduler.beat_relay import BeatRelay
from services.scheduler.dispatcher import Dispatcher
from services.scheduler.due import Due, Pace, relay_wait, soon_enough_for
from services.scheduler.finaliser import SWEEP_EVERY_S, Finaliser
from services.scheduler.gather import Gather
from services.scheduler.host_queues import HostQueues
from services.scheduler.leader import Leadership
from services.scheduler.pilots import PilotPool
from services.scheduler.reaper import Reaper
from services.scheduler.relay import Relay
from services.scheduler.retention import Retention
from services.scheduler.settings import SchedulerSettings
from services.scheduler.signer import Signer
from services.scheduler.triage import Triage, end_probing
from services.scheduler.waiters import Waiters
from shared.batch.slurm import BatchError, Slurm
from shared.domain.analysers import load_analysers
from shared.domain.errors import UNAVAILABLE
from shared.domain.messages import JobOutcome
from shared.domain.states import FAILED
from shared.messaging import relay_nudges
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.beat_board import BeatBoard
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology, declare_work_queue, pool_key
from shared.objects import open_store
from shared.runtime.health import Health
from shared.runtime.lifecycle import stop_on_signals, wait_or_stop, wait_or_woken
from shared.store import activity, outbox, plan_repo
from shared.store.db import Pool, check_schema, open_pool
from shared.store.transition_writer import NUDGE_EVERY_S

logger = logging.getLogger(__name__)

#: The dispatcher's gap for task ends is this many times its last look's own time (`Due`):
#: while tasks wait, it spends at most a sixth of its time looking for what ends freed. Five
#: rather than two: at 100 hosts under load the control plane spent 7-12 % less a task and a
#: one-task job, at the same or a higher rate.
GAP_PER_LOOK: Final = 5.0
#: The waiters look this long after a task's end at most (`Scheduler.waiters_due`).
WAITERS_GAP_S: Final = 0.1
_REAP_EVERY_S = 1.0  # the reaper need not run every tick
_TALLY_EVERY_S = 5.0  # the charts' counts are written this often (one statement)
_RETENTION_BATCH = 100  # purges per pruning round
_ERROR_PAUSE_S = 1.0


@dataclass(frozen=True)
class Round:
    """What a scheduling round did: `done` things, and whether a step left `more`."""

    done: int
    more: bool

    def plus(self, done: int, more: bool = False) -> "Round":
        """This round with a step that did `done` things (and left `more`) added."""
        return Round(self.done + done, self.more or more)


class Scheduler:
    """One leader's work, each step a `run_once()` that integration tests can call."""

    def __init__(self, settings: SchedulerSettings, pool: Pool, broker: Broker, redis: Redis):
        self.settings = settings
        self.pool = pool
        self.relay = Relay(pool, broker, settings.scheduler_batch)
        self.dispatcher = Dispatcher(
            pool,
            settings.scheduler_batch,
            settings.worker_pool,
            settings.max_in_flight_per_user,
            policy=settings.policy(),
            fresh_s=settings.dead_host_s,
            short_prefetch=settings.short_prefetch,
            short_task_s=settings.short_task_s,
        )
        self.finaliser = Finaliser(
            pool, redis, RedisKeys(settings.namespace), settings.scheduler_batch
        )
        self.reaper = Reaper(pool, settings.dead_host_s)
        #: Retired hosts' queues deleted, once nothing in them is owed.
        self.host_queues = HostQueues(
            pool, broker, settings.dead_host_s, on_deleted=self.relay.forget_host
        )
        #: Hosts' beats from Redis into `hosts`.
        self.beats = BeatRelay(pool, BeatBoard(redis, RedisKeys(settings.namespace)))
        #: Pilots on a batch system, when one is configured.
        self.pilots = (
            PilotPool(pool, Slurm(), settings.pilots())
            if settings.pilots_backend == "slurm"
            else None
        )
        self._last_pilots = 0.0
        #: Wakes the relay (set by `main` to the relay loop's event).
        self.wake_relay: Callable[[], None] = lambda: None
        #: The relay's gather under load, cut short by what the round writes that someone
        #: waits on (work messages, jobs' ends).
        self.gather = Gather(settings.relay_gather_s)
        self.retention = Retention(
            pool, _RETENTION_BATCH, open_store(settings.store_url, settings.s3_endpoint_url)
        )
        self.waiters = Waiters(pool, settings.scheduler_batch)
        triage_settings = settings.triage()
        self.breaker_settings = triage_settings.breaker
        self.triage = Triage(pool, load_analysers(), triage_settings)
        self._last_reap = self._last_prune = 0.0
        #: The triage looks when a task failed, the waiters when a task was decided while
        #: tasks were waiting, and `WAITERS_GAP_S` after a task ended then (one look for the
        #: ends of the gap: under load a task ends every few milliseconds, and what waits on
        #: prerequisites is seldom there).
        self.triage_due = Due(SWEEP_EVERY_S)
        self.waiters_due = Due(SWEEP_EVERY_S, WAITERS_GAP_S)
        #: The dispatcher looks when told (a triage decision; a probe ended; a full batch
        #: placed), a gap after its last look on a 'round' notification (tasks added, a job
        #: made active, a claim given back...) and while tasks wait (a throttle, a cap, a
        #: prerequisite, a backoff, capacity: a task's end may free them): `GAP_PER_LOOK`
        #: times the look's own time, at most `VIGIL_RELEASE_GAP_S`, none on a small pool or
        #: after a long quiet; and at least every sweep. With none waiting, a task's end
        #: frees none.
        self.release_due = Due(SWEEP_EVERY_S, settings.release_gap_s, GAP_PER_LOOK)
        #: Whether the dispatcher's last look saw tasks waiting (`Released.waiting`).
        self.waiting = True
        #: How long an idle round waits: from the tick up to the sweep's period.
        tick_s = settings.scheduler_tick_s
        self.pace = Pace(tick_s, max(tick_s, SWEEP_EVERY_S))
        self.triage.on_backoff = lambda seconds: self.pace.due_in(seconds, time.monotonic())
        #: Per-minute counts of the published task events, for the dashboard's charts.
        self.tally = activity.Tally()
        self._last_tally = 0.0
        self._last_analysis = 0.0
        #: When the round is to wake for the finaliser's next look (`_look_again`).
        self._finaliser_wake = 0.0

    def _relay_at_once(self) -> None:
        """Wake the relay for rows someone waits on, and end its gather if one is under way."""
        self.wake_relay()
        self.gather.hurry()

    async def run_once(self) -> Round:
        """One round of every step: how much it did, and whether a step left work it could
        not finish in this round (a full batch, a job it could not lock). The dispatcher goes
        first (a submission is waiting on it), and the relay is woken in-process for what the
        round wrote, without waiting for the notification to come back."""
        ran = await self._release_and_decide(time.monotonic())
        for due in (self.release_due, self.waiters_due):
            soon = due.soon_in(time.monotonic())
            if soon:  # the step's next look waits for its gap: the round wakes for it
                self.pace.due_in(soon, time.monotonic())
        ended = await self.finaliser.run_once()
        if ended:  # their submitters wait for the jobs' ends
            self._relay_at_once()
        ran = ran.plus(ended, self.finaliser.pending)
        now = time.monotonic()
        self._look_again(now)
        if now - self._last_reap >= _REAP_EVERY_S:
            self._last_reap = now
            ran = ran.plus(await self.reaper.run_once())
            ran = ran.plus(await self._give_back_from_gone_hosts())
            ran = ran.plus(await self.host_queues.run_once())
            probed = await end_probing(self.pool)  # jobs whose throttle is back: release now
            if probed:
                self.release_due.tell()
            ran = ran.plus(probed, probed > 0)
            ran = ran.plus(await breaker.sweep(self.pool, self.breaker_settings))
        if self.pilots is not None and now - self._last_pilots >= pilots.EVERY_S:
            self._last_pilots = now
            ran = ran.plus(await self._look_at_pilots(self.pilots))
        if now - self._last_tally >= _TALLY_EVERY_S:
            self._last_tally = now
            async with self.pool.acquire() as conn:
                await self.tally.flush(conn)
        if not self.pace.slowed and now - self._last_analysis >= statistics.EVERY_S:
            self._last_analysis = now
            async with self.pool.acquire() as conn:
                await statistics.analyse_due(conn, self.dispatcher.planning.held)
        if now - self._last_prune >= self.settings.prune_every_s:
            self._last_prune = now
            await pruning.prune(self.pool, self.settings)
            ran = ran.plus(await self.retention.run_once())
        return ran

    async def _look_at_pilots(self, pool: PilotPool) -> int:
        """The pilot pool's look; a batch system that does not answer is logged and tried
        again at the next look (the round goes on)."""
        try:
            return await pool.run_once()
        except BatchError as exc:
            logger.warning("pilots: the batch system did not answer: %s", exc)
            return 0

    async def _give_back_from_gone_hosts(self) -> int:
        """New tasks placed on a host whose worker is gone, not taken: placed again."""
        async with self.pool.acquire() as conn:
            given = await plan_repo.give_back_from_gone_hosts(conn, self.settings.dead_host_s)
        if given:
            logger.warning("%d task(s) placed on gone hosts placed again", given)
            self.release_due.tell()
        return given

    def _look_again(self, now: float) -> None:
        """Wake the round when a job the finaliser found unfinished lately is due another look
        (once per such moment: the round's idle wait never passes it)."""
        at = self.finaliser.next_look()
        if at is not None and not now < self._finaliser_wake <= at:
            self._finaliser_wake = at
            self.pace.due_in(at - now, now)

    async def _release_and_decide(self, now: float) -> Round:
        """The dispatcher, the triage and the waiters, each when due (`Due`)."""
        done, more = 0, False
        if self.release_due.due(now):
            release = await self.dispatcher.run_once()
            # its read began after `now`: what the finaliser was told of before, it saw
            self.finaliser.unfinished(release.unfinished, now)
            self.waiting = release.waiting
            self.release_due.ran(release.waiting, now, time.monotonic() - now)
            self.release_due.soon_enough = soon_enough_for(self.dispatcher.planning.cpus)
            if release.released:  # hosts wait for the work
                self._relay_at_once()
            done = release.released
            more = release.released >= self.settings.scheduler_batch
            if more:  # what is left fits now: no gap
                self.release_due.tell()
        if self.triage_due.due(now):
            decided = await self.triage.run_once()
            self.triage_due.ran(self.triage.left > 0, now)
            done += decided
            more |= self.triage.left > 0
            if decided:  # a resubmission or recovery may be releasable at once
                self.release_due.tell()
        if self.waiters_due.due(now):
            failed = await self.waiters.run_once()
            self.waiters_due.ran(failed > 0, now)
            if failed:  # there may be more, behind those: no gap
                self.waiters_due.tell()
            done += failed
            more |= failed > 0
        return Round(done, more)

    def ended_while(self, leadership: Leadership) -> Callable[[str], None]:
        """What the notification of a task's end tells (migration 0030), while leading: the
        finaliser, of its job; the dispatcher and the waiters, if tasks wait (what waited on
        the task may be releasable, or out of reach). A standby keeps nothing: its first
        round as the leader sweeps."""

        def ended(job_id: str) -> None:
            if leadership.held:
                self.finaliser.touch(job_id)
                if self.waiting:
                    self.release_due.tell_soon()
                    self.waiters_due.tell_soon()

        return ended

    def _on_published(self, row: outbox.OutboxRow, wake: asyncio.Event) -> None:
        """A task's failure (for the triage), a triage decision (which may end its job: the
        finaliser looks, and the waiters and the dispatcher if tasks wait), or a job someone
        cancelled (its keys are purged). What else a task's end sets off was told by the
        notification of its commit, before the relay read it (`ended_while`). While the round
        sleeps long (idle), any event wakes it: a task moved, and what waited on it may be
        releasable."""
        if row.exchange != "events":
            return
        kind, _, rest = row.routing_key.partition(".")
        word, _, subject = rest.partition(".")
        self.tally.count(row.routing_key, row.body, row.created_at)
        if self.pace.slowed:
            wake.set()
        if kind == "task":
            if word in _FAILED_WORDS:
                self.triage_due.tell()
                wake.set()
            elif word in _VERDICTS:
                if self.waiting:
                    self.release_due.tell()
                    self.waiters_due.tell()
                self.finaliser.touch(subject)
                wake.set()
        elif kind == "job" and word == _CANCELLED:
            self.finaliser.cancelled(subject)
            wake.set()

    async def relay_loop(
        self, stop: asyncio.Event, wake: asyncio.Event, rounds: asyncio.Event, lead: Leadership
    ) -> None:
        """Relay the outbox while leading, batch after batch, then wait for an insert."""
        self.relay.on_published = lambda row: self._on_published(row, rounds)
        polling = False  # woken by the clock, not by an insert or a busy batch
        heard = time.monotonic()  # the last notification or batch
        before = 0  # what the read before this one published
        while not stop.is_set():
            if not lead.held:
                await self.relay.drain()
                await wait_or_stop(stop, self.settings.scheduler_tick_s)
                continue
            wake.clear()
            self.gather.reading()
            try:
                relayed = await self.relay.run_once(look_first=polling)
            except (*UNAVAILABLE, RuntimeError) as exc:
                logger.warning("relay failed, retrying: %s", exc)
                await wait_or_stop(stop, _ERROR_PAUSE_S)
                continue
            now = time.monotonic()
            if relayed or not polling:
                heard = now
            polling = False
            await self.gather.wait(stop, relayed, before)  # busy: the next batch fills a little
            before = relayed
            if not relayed:
                wait = relay_wait(now - heard, self.settings.relay_poll_s, NUDGE_EVERY_S)
                await wait_or_woken(stop, wake, wait)
                polling = not wake.is_set()
        await self.relay.drain()

    async def beat_loop(self, stop: asyncio.Event, lead: Leadership) -> None:
        """Write hosts' beats from Redis into PostgreSQL while leading (`beat_relay.py`)."""
        every = beat_relay.every_s(self.settings.dead_host_s)
        while not await wait_or_stop(stop, every):
            if not lead.held:
                continue
            try:
                await self.beats.run_once()
            except UNAVAILABLE as exc:  # the hosts beat PostgreSQL themselves meanwhile
                logger.warning("hosts' beats not written: %s", exc)

    async def run(self, stop: asyncio.Event, wake: asyncio.Event, leadership: Leadership) -> None:
        """Loop until `stop`; a failing round is logged and retried (the servers may restart).

        Work is done only while the advisory lock is held; a lost lock is waited for again.
        A round that left work goes on at once; any other waits for something to wake it, at
        most `tick_s` after one that did something (what it wrote wakes it through the relay),
        longer after each idle one (`due.Pace`).
        """
        while not stop.is_set():
            if not leadership.held:
                self.dispatcher.planning.forget()  # a standby's memory is no leader's
                if not await leadership.acquire(stop):
                    return
            notified = wake.is_set()
            wake.clear()
            started = time.monotonic()
            try:
                ran = await self.run_once()
            except (*UNAVAILABLE, RuntimeError) as exc:
                logger.warning("scheduler round failed, retrying: %s", exc)
                self.wake_relay()
                await wait_or_stop(stop, _ERROR_PAUSE_S)
                continue
            if notified:  # the rows that woke the round go out with what the round wrote
                self.wake_relay()
            if ran.done or notified:
                self.pace.stir()
            if ran.more:
                continue
            await wait_or_woken(stop, wake, self.pace.idle_wait(started))


#: The middle words of the events the scheduler acts on (`task.<word>.<job id>`,
#: `job.<word>.<job id>`).
_CANCELLED = JobOutcome.CANCELLED.value
_FAILED_WORDS = frozenset(s.value for s in FAILED)
_VERDICTS = frozenset({"recovered", "resubmitted", "abandoned"})


#: The notification of a task's end: this prefix, then its jobs' ids, comma-separated.
_ENDED = "ended "


def _on_notify(
    round_wake: asyncio.Event,
    relay_wake: asyncio.Event,
    release: Due,
    ended: Callable[[str], None],
    payload: object,
) -> None:
    """'relay': rows only the relay has to act on (migrations 0014, 0027, 0028); 'ended <job
    ids>': tasks of these jobs ended (0030): the relay, and the round, whose finaliser is told
    of each job (`ended`) at once; anything else ('round'): the round, and its dispatcher
    (`release`) once the gap after its last look has passed (`Due.tell_soon`: under load one
    look for the submissions of the gap, not one for every two or three; after a quiet spell,
    or on a small pool, at once), which wakes the relay once it has run, so that the
    `task.new` events of added tasks and the `RunStage` messages the round writes for them go
    out in one batch."""
    if payload == "relay":
        relay_wake.set()
    elif isinstance(payload, str) and payload.startswith(_ENDED):
        for job_id in payload.removeprefix(_ENDED).split(","):
            ended(job_id)
        relay_wake.set()
        round_wake.set()
    else:
        release.tell_soon()
        round_wake.set()


async def _listen(
    dsn: str,
    round_wake: asyncio.Event,
    relay_wake: asyncio.Event,
    release: Due,
    ended: Callable[[str], None],
    stop: asyncio.Event,
) -> None:
    """Wake the round and the relay on outbox inserts (as the notification says; `ended` is
    told of each job a task ended in); reconnect when the database comes back."""
    while not stop.is_set():
        try:
            conn = await asyncpg.connect(dsn)
        except UNAVAILABLE as exc:
            logger.warning("cannot listen for outbox inserts yet: %s", exc)
            await wait_or_stop(stop, _ERROR_PAUSE_S)
            continue
        try:
            await conn.add_listener(
                "vigil_outbox",
                lambda _conn, _pid, _channel, payload: _on_notify(
                    round_wake, relay_wake, release, ended, payload
                ),
            )
            while not stop.is_set() and not conn.is_closed():
                await wait_or_stop(stop, _ERROR_PAUSE_S)
        finally:
            if not conn.is_closed():
                await conn.close()


async def main(settings: SchedulerSettings) -> None:
    """Wait for leadership, then run the loop until SIGTERM."""
    health = Health("scheduler")
    async with stop_on_signals() as stop, AsyncExitStack() as stack:
        await stack.enter_async_context(
            health.serve(settings.health_host, settings.scheduler_health_port)
        )
        health.starting("connecting to PostgreSQL")
        pool = await stack.enter_async_context(open_pool(settings.database_url, wait=True))
        await check_schema(pool)
        topology = Topology(settings.namespace)
        health.starting("connecting to RabbitMQ")
        broker = await stack.enter_async_context(
            open_broker(settings.amqp_url, topology, "scheduler")
        )
        await declare_work_queue(
            broker.channel,
            topology,
            topology.pool_queue(settings.worker_pool),
            pool_key(settings.worker_pool),
        )
        await dead_letters.start(broker, pool)
        signer = (  # an S3 store: hosts hold no credential, their links are signed here
            Signer.of_store(
                pool, settings.store_url, settings.s3_endpoint_url, settings.signed_link_s
            )
            if settings.store_url.startswith("s3://")
            else None
        )
        health.starting("connecting to Redis")
        redis = await stack.enter_async_context(open_redis(settings.redis_url))
        leadership = Leadership(settings.database_url)
        stack.push_async_callback(leadership.release)
        health.up(scheduler_health.probe(pool, broker, redis, leadership))
        scheduler = Scheduler(settings, pool, broker, redis)
        # What the start made (modules, pools, connections) lives as long as the process: out
        # of the collector's generations, its periodic passes walk only what the rounds make
        # (the collector was 8 % of the leader's samples).
        gc.freeze()
        wake, relay_wake = asyncio.Event(), asyncio.Event()
        scheduler.wake_relay = relay_wake.set
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                _listen(
                    settings.database_url,
                    wake,
                    relay_wake,
                    scheduler.release_due,
                    scheduler.ended_while(leadership),
                    stop,
                ),
                name="listen",
            )
            tg.create_task(
                relay_nudges.listen(
                    redis, RedisKeys(settings.namespace).relay_nudges(), relay_wake.set, stop
                ),
                name="nudges",
            )
            tg.create_task(scheduler.run(stop, wake, leadership), name="loop")
            tg.create_task(scheduler.relay_loop(stop, relay_wake, wake, leadership), name="relay")
            tg.create_task(scheduler.beat_loop(stop, leadership), name="beats")
            if signer is not None:
                tg.create_task(signer.serve(broker, stop), name="signer")
    logger.info("scheduler stopped")
