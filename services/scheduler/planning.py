"""Placing new tasks on hosts by the shared pool's policy: the leading scheduler's
round reads the feed (`plan_repo.read`), asks the planner (`shared/domain/scheduling`), and
in the same transaction claims each assignment's tasks for its host, queues their work
messages to that host's queue, and writes the reasons of the jobs left waiting.

New work is handed to a host only for capacity it has free (plus `VIGIL_WORKER_PREFETCH`
tasks to set up ahead); everything else waits in PostgreSQL, in the policy's order, never
in the broker. What this module keeps between rounds (the planner is pure):

- the hosts held for large requests (`Plan.reservations`), in memory: a new leader starts
  with none, and holds again at the next pass-over (the bound counts from there);
- the reasons it last wrote, so that a round writes a reason that changed at once and new
  numbers of the same reason at the next full round (`FULL_EVERY_S`; a new leader clears
  what the last one left);
- when it last charged usage: every `CHARGE_EVERY_S`, each user holding resources (or held
  at the last charge) has its decayed usage brought up to now (`fairshare.charged`).

A host whose breaker probes takes one task at a time: it is offered only while it holds
none, and given one task at most.
"""

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from shared.domain.scheduling import fairshare
from shared.domain.scheduling.model import (
    Assignment,
    HostState,
    JobDemand,
    Plan,
    Round,
    Settings,
    UserState,
    expected_runtime,
)
from shared.domain.scheduling.planner import plan
from shared.domain.scheduling.reasons import detail
from shared.domain.scheduling.resources import NOTHING, Pricing, total
from shared.store import plan_repo
from shared.store.db import Connection

logger = logging.getLogger(__name__)

#: A full round (every job with tasks to place: every reason, with its numbers) runs this
#: often (seconds); quick rounds between read each user's best-ranked jobs only, `QUICK_EXTRA`
#: more than one round could place (`plan_repo._TOP_JOBS`): a round's cost then grows with
#: users and what it places, not with how many jobs wait.
FULL_EVERY_S: Final = 2.0
QUICK_EXTRA: Final = 4

#: Which users' work is short is looked at this often (seconds), over the commands that
#: started in the last `SHORT_WITHIN_S`, at least `SHORT_AT_LEAST` of them.
SHORT_EVERY_S: Final = 2.0
SHORT_WITHIN_S: Final = 10.0
SHORT_AT_LEAST: Final = 3

#: How often users' usage is charged (seconds): often enough that fair share follows what
#: runs, rarely enough that a busy round does not write every user.
CHARGE_EVERY_S: Final = 5.0


#: What a host's state is made from: its row, and its staged tasks not started yet.
_HostKey = tuple[plan_repo.HostRow, tuple[plan_repo.Staged, ...]]


@dataclass(frozen=True)
class Placed:
    """What a planning round did: tasks claimed, jobs left with tasks waiting, and the jobs
    its read saw with a task to place (unfinished when the read began)."""

    claimed: int
    waiting_jobs: int
    seen: frozenset[str] = frozenset()


@dataclass
class Planning:
    """The leading scheduler's planning rounds for one pool."""

    pool: str
    settings: Settings
    fresh_s: float  # a host's heartbeat counts as fresh this long
    batch: int  # at most this many tasks of a job are counted (and placed) per round
    user_cap: int | None = None
    #: Tasks handed to a host beyond its free capacity for every job (`VIGIL_WORKER_PREFETCH`).
    prefetch: int = 0
    #: When that is 0: for jobs of users whose commands are short (shorter than
    #: `short_task_s`, median, lately) only, so that a task staged behind them waits little
    #: and the host's next task is ready when one ends (`VIGIL_SHORT_PREFETCH`,
    #: `VIGIL_SHORT_TASK_S`).
    short_prefetch: int = 0
    short_task_s: float = 0.5
    _short: frozenset[str] = frozenset()
    _short_at: float = -SHORT_EVERY_S
    reservations: dict[str, str] = field(default_factory=dict)
    _written: dict[str, tuple[str, str, str]] | None = None
    _charged_at: float = 0.0
    _full_at: float = 0.0
    _charged: set[str] = field(default_factory=set)
    #: The CPUs of the hosts that took work at the last round (what a task's end frees a
    #: share of: `Due.soon_enough`).
    cpus: int = 0
    #: The tasks the hosts held at the last round (`statistics.analyse_due`'s `claimed`).
    held: int = 0
    #: Whether the feed finds the jobs with tasks to place from the pending tasks rather than
    #: by probing every placeable job (`plan_repo.feed_from_pending`, at each full round): a
    #: pool running thousands of one-task jobs has thousands of active jobs, few of them
    #: waiting.
    pending_first: bool = False
    #: The hosts as the last round read them (`plan_repo.KnownHosts`), and the state the
    #: planner was given of each (a host that reads the same is given the same state).
    known_hosts: plan_repo.KnownHosts = field(default_factory=plan_repo.KnownHosts)
    _states: dict[str, tuple[_HostKey, HostState]] = field(default_factory=dict)

    async def run_once(self, conn: Connection) -> Placed:
        """One round, in the caller's transaction: a full one (every job with tasks to place)
        every `FULL_EVERY_S`, quick ones (each user's best-ranked jobs only) between."""
        clock = time.monotonic()
        full = self._written is None or clock - self._full_at >= FULL_EVERY_S
        if full:
            self._full_at = clock
        staging = self.prefetch or self.short_prefetch  # the operator's, when set, for all
        top = None if full else (QUICK_EXTRA, self.settings.age_per_hour)
        # nothing of the last rounds to undo (reasons written, hosts held): where no job has
        # a task to place, there is nothing to read or plan (`cpus` and `held` stay as the
        # last round that read the hosts saw them)
        quiet = self._written == {} and not self.reservations
        feed = await plan_repo.read_unless_idle(
            conn,
            self.pool,
            self.fresh_s,
            staging,
            self.batch,
            top,
            self.pending_first,
            skip_idle=quiet,
            known=self.known_hosts,
        )
        if feed is None:
            return Placed(0, 0)
        if feed.placeable_jobs is not None:  # a full round: the cheaper way for the next ones
            self.pending_first = plan_repo.feed_from_pending(len(feed.jobs), feed.placeable_jobs)
        await self._look_at_short_work(conn)
        round_, probing = self._round(feed)
        self.cpus = sum(h.capacity.millicpus for h in round_.hosts if h.accepting) // 1000
        self.held = sum(h.load.tasks for h in feed.hosts)
        settings = replace(self.settings, prefetch=staging)
        result = _one_each_on(probing, plan(round_, settings))
        seen = {j.job_id for j in feed.jobs}
        self.reservations = dict(result.reservations) | {
            job: host for job, host in self.reservations.items() if not full and job not in seen
        }
        claimed = await plan_repo.claim(conn, [_claim(a) for a in result.assignments])
        await self._write_waits(conn, result, None if full else seen)
        await self._charge(conn, feed)
        # a quick round saw some jobs only: those it did not see may wait
        waiting = len(result.waits) if full else max(len(result.waits), len(feed.jobs))
        return Placed(claimed, waiting, frozenset(seen))

    async def _look_at_short_work(self, conn: Connection) -> None:
        if self.prefetch or not self.short_prefetch:
            return
        clock = time.monotonic()
        if clock - self._short_at < SHORT_EVERY_S:
            return
        self._short_at = clock
        self._short = await plan_repo.short_users(
            conn, self.pool, SHORT_WITHIN_S, self.short_task_s, SHORT_AT_LEAST
        )

    def forget(self) -> None:
        """Leadership lost: what this instance kept is no longer the truth."""
        self.reservations, self._written, self._charged = {}, None, set()
        self._charged_at = 0.0

    def _round(self, feed: plan_repo.Feed) -> tuple[Round, set[str]]:
        hosts, probing = [], set()
        last = self._states
        states: dict[str, tuple[_HostKey, HostState]] = {}
        for h in feed.hosts:
            host_id = h.load.host_id
            if h.quarantined and h.probing:
                probing.add(host_id)
            staged = feed.staged.get(host_id, ())
            known = last.get(host_id)
            # not the same row as the last round's, or other staged tasks
            if known is None or known[0][0] is not h or known[0][1] != staged:
                known = ((h, staged), _state(h, staged))
            states[host_id] = known
            hosts.append(known[1])
        self._states = states
        pricing = Pricing.of_pool(total(h.capacity for h in hosts if h.accepting))
        half_life = self.settings.half_life_s
        users = {
            u.user_id: UserState(
                u.user_id,
                share=u.share,
                usage=fairshare.charged(u.usage, pricing.cost(u.held), u.usage_age_s, half_life),
                in_flight=u.in_flight,
                held=u.held,
                cap=self.user_cap,
            )
            for u in feed.users.values()
        }
        jobs = [
            JobDemand(
                j.job_id,
                j.owner_id,
                j.waiting,
                j.request,
                j.priority,
                j.since,
                j.in_flight,
                j.max_in_flight,
                j.walltime_s,
                stageable=self.prefetch > 0 or j.owner_id in self._short,
                expected_s=expected_runtime(j.took_p95_s),
                restartable=j.restartable,
            )
            for j in feed.jobs
        ]
        round_ = Round(feed.now, hosts, jobs, users, dict(self.reservations), feed.stopped)
        return round_, probing

    async def _write_waits(self, conn: Connection, result: Plan, seen: set[str] | None) -> None:
        """The reasons that changed, of every job (a full round) or of those `seen` (a
        quick one: only a reason of another kind, the numbers wait for the next full one)."""
        if self._written is None:  # a new leader: what the last one left may be stale
            await plan_repo.clear_waits_but(conn, list(result.waits))
            self._written = {}
        # a new reason is written at once; new numbers of the same reason (tasks ahead, what
        # the closest host has free) by full rounds only: in a busy pool each task placed
        # moves the numbers of most waiting jobs (and a quick round does not render them)
        refresh = seen is None
        written = self._written
        changed: dict[str, tuple[str, str, str]] = {}
        for job, wait in result.waits.items():
            old = written.get(job)
            if old is not None and old[0] == wait.reason.value and not refresh:
                continue
            new = (wait.reason.value, wait.message(), json.dumps(detail(wait), sort_keys=True))
            if new != old:
                changed[job] = new
        looked_at = written.keys() if seen is None else seen & written.keys()
        gone = [job for job in looked_at if job not in result.waits]
        await plan_repo.write_waits(conn, changed, gone)
        for job in gone:
            del written[job]
        written.update(changed)

    async def _charge(self, conn: Connection, feed: plan_repo.Feed) -> None:
        clock = time.monotonic()
        if clock - self._charged_at < CHARGE_EVERY_S:
            return
        self._charged_at = clock
        pricing = Pricing.of_pool(total(h.load.capacity for h in feed.hosts))
        half_life = self.settings.half_life_s
        usage = {
            u.user_id: fairshare.charged(u.usage, pricing.cost(u.held), u.usage_age_s, half_life)
            for u in feed.users.values()
            if u.held != NOTHING or u.user_id in self._charged
        }
        self._charged = {user for user, u in feed.users.items() if u.held != NOTHING}
        await plan_repo.charge(conn, usage)


def _state(h: plan_repo.HostRow, staged: Sequence[plan_repo.Staged] = ()) -> HostState:
    """What the planner is given of a host: its load, and of what it holds, the staged tasks
    per owner and what the others hold beyond its capacity (tasks placed ahead of them)."""
    load = h.load
    accepting = h.live and not h.draining and (not h.quarantined or h.probing)
    if h.quarantined and h.probing:
        accepting = accepting and load.tasks == 0
    free = load.free
    staged_held = total(s.held for s in staged)
    return HostState(
        load.host_id,
        load.capacity,
        free,
        load.free_gpu_ids[: free.gpus],
        accepting and load.capacity.millicpus > 0,
        sum(s.count for s in staged),
        h.ends_at,
        tuple((s.owner_id, s.held) for s in staged),
        (load.held - load.capacity - staged_held).at_least_zero(),
    )


def _claim(a: Assignment) -> plan_repo.Claim:
    return plan_repo.Claim(a.job_id, a.host_id, a.count, a.gpu_ids, a.staged)


def _one_each_on(probing: set[str], result: Plan) -> Plan:
    """The plan with at most one task for each probing host (its breaker lets one through)."""
    if not probing:
        return result
    kept: list[Assignment] = []
    given: set[str] = set()
    for a in result.assignments:
        if a.host_id not in probing:
            kept.append(a)
        elif a.host_id not in given:
            given.add(a.host_id)
            kept.append(Assignment(a.job_id, a.host_id, 1, a.gpu_ids[:1], a.staged))
    return Plan(tuple(kept), result.waits, result.reservations, result.levels)
