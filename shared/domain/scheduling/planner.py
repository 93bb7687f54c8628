"""One planning round: which waiting tasks go to which host, and why the rest wait.

The round, in order:

1. An emergency stop, or no host taking work: nothing is placed, every job says so.
2. Reservations kept from the last round: a job whose held host now holds its request gets
   one task there before anything else; the others stay held (until the job starts, is
   throttled, or the host stops taking work).
3. Fair share: users lowest level first (`fairshare`), each turn one task of the user's
   best-ranked job (priority, plus `age_per_hour` points per hour its oldest task waited),
   placed by best fit (`board`); a user keeps the turn while they stay the lowest. A job
   whose request finds no room is passed over for the round, and smaller requests behind it
   go on (backfill); if it has waited `reserve_after_s`, the first placement behind it holds
   a host for it first (a reservation), on which nothing else takes what it needs.
4. Ahead of staged work: the same order again, for what found no room. A staged task (step
   5) waits on its host behind every task placed on capacity, so a task goes ahead of the
   staged tasks of users fair share serves after its own (a higher level): it takes the next
   capacity its host frees, before them, as it would have had they not been staged. Staging
   never makes a user wait behind work the order puts after theirs.
5. Prefetch: the same order again, staging tasks beyond hosts' free capacity, up to
   `prefetch` a host.
6. Reasons: every job with tasks still waiting gets one (`reasons`).

The cost is that of the tasks placed (a binary search and a heap step each), plus a few
steps per job and per user: not the number of tasks waiting, nor the history.
"""

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from shared.domain.scheduling import fairshare
from shared.domain.scheduling.board import Board, Host
from shared.domain.scheduling.model import (
    Assignment,
    JobDemand,
    Plan,
    Round,
    Settings,
    UserState,
)
from shared.domain.scheduling.reasons import (
    EmergencyStop,
    EndsTooSoon,
    FairShare,
    NoHost,
    Priority,
    Reserved,
    Throttled,
    TooLarge,
    UserCapped,
    Wait,
    WaitsForResources,
)
from shared.domain.scheduling.resources import Pricing, Resources


def plan(round_: Round, settings: Settings | None = None) -> Plan:
    """Decide one round (see the module's docstring)."""
    if round_.emergency_stop:
        return _nobody_starts(round_, EmergencyStop())
    if not any(h.accepting for h in round_.hosts):
        return _nobody_starts(round_, NoHost(len(round_.hosts)))
    return _Planner(round_, settings or Settings()).run()


def _nobody_starts(round_: Round, why: Wait) -> Plan:
    """Nothing placed; every job with waiting tasks gives `why`; reservations stay as they
    were (the next round that places anything looks at them again)."""
    waits = {job.job_id: why for job in round_.jobs if job.waiting}
    return Plan((), waits, dict(round_.reservations), {})


def rank(job: JobDemand, now: float, age_per_hour: float) -> tuple[float, float, str]:
    """A job's place among its user's jobs (smallest first): priority plus age, so that a
    job of low priority overtakes newer ones of a higher priority `p` points above it after
    `p / age_per_hour` hours of waiting (no starvation); then the oldest; then by id."""
    waited_h = max(0.0, now - job.waiting_since) / 3600
    return (-(job.priority + age_per_hour * waited_h), job.waiting_since, job.job_id)


@dataclass(slots=True)
class _Job:
    """A job during the round."""

    demand: JobDemand
    placed: int = 0
    passed_over: bool = False  # its request found no room this round
    eligible: int = 0  # after the round: its tasks that could be given next

    @property
    def left(self) -> int:
        return self.demand.waiting - self.placed

    @property
    def room(self) -> int:
        """Tasks it may still be given: what waits, within its throttle."""
        d = self.demand
        if d.max_in_flight is None:
            return self.left
        return max(0, min(self.left, d.max_in_flight - d.in_flight - self.placed))


@dataclass(slots=True)
class _User:
    """A user during the round: their jobs best-ranked first, and their level."""

    state: UserState
    jobs: list[_Job]
    recent: float  # `fairshare.recent` of their usage
    held: Resources
    level: float
    oldest: float  # when their oldest waiting task began to wait: ties go to the oldest
    placed: int = 0
    next: int = 0  # their first job still open in this pass

    @property
    def room(self) -> int | None:
        """Tasks they may still be given under their cap (None: no cap)."""
        cap = self.state.cap
        return None if cap is None else max(0, cap - self.state.in_flight - self.placed)

    def top(self) -> _Job | None:
        return self.jobs[self.next] if self.next < len(self.jobs) else None


#: The next user in fair-share order: (level, oldest, their number); None: nobody else.
_Next = tuple[float, float, int] | None
_Attempt = Callable[[_User, _Job, _Next], int]


@dataclass
class _Planner:
    """A round's mutable state; `run` goes through the steps once."""

    round_: Round
    settings: Settings
    board: Board = field(init=False)
    pricing: Pricing = field(init=False)
    users: dict[str, _User] = field(init=False)
    pending: list[_Job] = field(default_factory=list)  # passed over long enough, no host yet
    #: Requests (with the time they must last until) that found no room this round.
    no_room: set[tuple[Resources, float | None]] = field(default_factory=set)
    placements: dict[tuple[str, str, bool], list[tuple[str, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.board = Board(self.round_.hosts)
        self.pricing = Pricing.of_pool(self.board.capacity)
        self.users = self._users_of(_Job(d) for d in self.round_.jobs if d.waiting)

    def _users_of(self, jobs: Iterable[_Job]) -> dict[str, _User]:
        owned: dict[str, list[_Job]] = defaultdict(list)
        for job in jobs:
            owned[job.demand.user].append(job)
        return {name: self._user(name, of) for name, of in owned.items()}

    def _user(self, name: str, jobs: list[_Job]) -> _User:
        state = self.round_.users.get(name) or UserState(name)
        now, per_hour = self.round_.now, self.settings.age_per_hour
        jobs.sort(key=lambda j: rank(j.demand, now, per_hour))
        recent = fairshare.recent(state.usage, self.settings.half_life_s)
        oldest = min(j.demand.waiting_since for j in jobs)
        user = _User(state, jobs, recent, state.held, 0.0, oldest)
        user.level = self._level(user, state.held)
        return user

    def _level(self, user: _User, held: Resources) -> float:
        return (self.pricing.cost(held) + user.recent) / user.state.share

    def run(self) -> Plan:
        self._keep_reservations()
        self._serve(self._place)
        if self.board.has_staged:
            self._again(self._ahead)
        if self.settings.prefetch > 0:
            self._again(self._stage)
        return Plan(
            assignments=tuple(
                Assignment(job_id, host_id, len(devices), tuple(devices), staged)
                for (job_id, host_id, staged), devices in self.placements.items()
            ),
            waits=self._explain(),
            reservations={job_id: h.host_id for job_id, h in self.board.held().items()},
            levels={name: user.level for name, user in self.users.items()},
        )

    # -- reservations ---------------------------------------------------------------------

    def _keep_reservations(self) -> None:
        """Last round's holds: the job starts one task where its host now holds it, else the
        host stays held, while the job may still start and the host takes work."""
        jobs = {j.demand.job_id: (u, j) for u in self.users.values() for j in u.jobs}
        kept = [(jobs[i], h) for i, h in self.round_.reservations.items() if i in jobs]
        for (user, job), host_id in sorted(kept, key=lambda k: _oldest_first(k[0][1])):
            host = self.board.get(host_id)
            if host is None or not self._may_hold(user, job, host):
                continue
            if job.demand.request.fits_in(host.free):
                self._record(user, job, host, 1, staged=False)
            else:
                self.board.hold(host, job.demand.job_id, job.demand.request)

    def _may_hold(self, user: _User, job: _Job, host: Host) -> bool:
        return (
            host.held_for is None
            and job.room > 0
            and user.room != 0
            and job.demand.request.fits_in(host.capacity)
            and host.lasts_until(self._until(job))
            and len(self.board.held()) < self.settings.max_reservations
        )

    def _pass_over(self, job: _Job) -> None:
        """A job whose request found no room: done for this pass; one that has waited long
        enough gets a host held for it as soon as something behind it is placed."""
        if job.passed_over:
            return
        job.passed_over = True
        waited = self.round_.now - job.demand.waiting_since
        if waited >= self.settings.reserve_after_s and job.demand.job_id not in self.board.held():
            self.pending.append(job)

    def _hold_for_pending(self) -> None:
        """Hold a host for each job passed over long enough (first in the order first),
        within `max_reservations`: a placement behind them is about to happen."""
        for job in self.pending:
            if len(self.board.held()) >= self.settings.max_reservations:
                break
            host = self.board.host_to_hold(job.demand.request, self._until(job))
            if host is not None:
                self.board.hold(host, job.demand.job_id, job.demand.request)
        self.pending.clear()

    # -- serving users in fair-share order --------------------------------------------------

    def _again(self, attempt: _Attempt) -> None:
        """Another pass of `_serve`, every user's jobs open again."""
        for user in self.users.values():
            user.next = 0
        self._serve(attempt)

    def _serve(self, attempt: _Attempt) -> None:
        """Users lowest level first, until none can be given anything more by `attempt`
        (which gives tasks of the job and says how many: none closes the job this pass)."""
        users = list(self.users.values())
        heap = [(u.level, u.oldest, n) for n, u in enumerate(users)]
        heapify(heap)
        while heap:
            n = heappop(heap)[2]
            user = users[n]
            self._turn(user, heap, attempt)
            if user.top() is not None:
                heappush(heap, (user.level, user.oldest, n))

    def _turn(self, user: _User, heap: list[tuple[float, float, int]], attempt: _Attempt) -> None:
        """One user's turn: their best-ranked open job's tasks while they stay the lowest (a
        job that can be given nothing more is closed for this pass)."""
        while (job := user.top()) is not None:
            if user.room == 0:
                user.next = len(user.jobs)
                return
            after = heap[0] if heap else None
            if job.room == 0 or attempt(user, job, after) == 0:
                user.next += 1
                continue
            if after is not None and (user.level, user.oldest) > after[:2]:
                return

    def _place(self, user: _User, job: _Job, after: _Next) -> int:
        """Tasks of `job` on the best-fit host's room while its user stays the lowest, or
        none (the job is passed over)."""
        need, until = job.demand.request, self._until(job)
        known_not = self.no_room and (need, until) in self.no_room
        host = None if known_not else self.board.best_fit(need, until)
        if host is None:
            self.no_room.add((need, until))
            self._pass_over(job)
            return 0
        if self.pending:
            self._hold_for_pending()
            return self._place(user, job, after)  # the holds may have taken what it found
        most = _capped(min(job.room, host.fits(need)), user.room)
        count = self._while_lowest(user, need, after, most)
        self._record(user, job, host, count, staged=False)
        self.board.unhold(job.demand.job_id)  # a hold for it has done its work
        return count

    def _until(self, job: _Job) -> float | None:
        """Until when a host must take work for a task of `job` to end there: its walltime
        from now, else what its job's finished tasks took (`JobDemand.expected_s`); for a
        task that is not restartable and of unknown length, for ever (a host that ends would
        fail it); None: any host (a restartable task lost with its host is run again)."""
        d = job.demand
        runs = d.walltime_s if d.walltime_s is not None else d.expected_s
        if runs is not None:
            return self.round_.now + runs
        return None if d.restartable else math.inf

    def _while_lowest(self, user: _User, need: Resources, after: _Next, most: int) -> int:
        """How many tasks of `need` (1 to `most`) the user is given before their level passes
        the next user's: one at a time, they would be given exactly as many."""
        if after is None:
            return most
        count, held = 0, user.held
        while count < most:
            count += 1
            held += need
            if (self._level(user, held), user.oldest) > after[:2]:
                break
        return count

    def _ahead(self, user: _User, job: _Job, after: _Next) -> int:
        """One task of `job` placed ahead of the staged tasks of users above its user's level
        (`Board.ahead`), or none."""
        level = user.level
        behind = self._behind(level)
        host = self.board.ahead(job.demand.request, behind, self._until(job))
        if host is None:
            return 0
        self._record(user, job, host, 1, staged=False, taken=False)
        return 1

    def _behind(self, level: float) -> Callable[[str], bool]:
        """Whether fair share serves a user after one at `level`: theirs is higher."""
        return lambda owner: self._level_of(owner) > level

    def _level_of(self, name: str) -> float:
        """A user's level now: as the round has it for a user with tasks waiting, else from
        what they hold and their usage."""
        user = self.users.get(name)
        if user is not None:
            return user.level
        state = self.round_.users.get(name) or UserState(name)
        recent = fairshare.recent(state.usage, self.settings.half_life_s)
        return (self.pricing.cost(state.held) + recent) / state.share

    def _stage(self, user: _User, job: _Job, after: _Next) -> int:
        """One task of `job` staged on a host beyond its free capacity (prefetch), or none.
        It takes no capacity now, so it holds no host for a job passed over either."""
        if not job.demand.stageable:
            return 0
        host = self.board.stage(job.demand.request, self.settings.prefetch, self._until(job))
        if host is None:
            return 0
        self._record(user, job, host, 1, staged=True)
        return 1

    def _record(
        self, user: _User, job: _Job, host: Host, count: int, staged: bool, taken: bool = True
    ) -> None:
        """Tasks given: the host's capacity taken (unless staged, or placed ahead of staged
        tasks: not `taken`), the user's level raised."""
        need = job.demand.request
        devices = self.board.take(host, need, count) if taken and not staged else [()] * count
        job.placed += count
        user.placed += count
        user.held += need.times(count)
        user.level = self._level(user, user.held)
        key = (job.demand.job_id, host.host_id, staged)
        self.placements.setdefault(key, []).extend(devices)

    # -- reasons ------------------------------------------------------------------------------

    def _explain(self) -> dict[str, Wait]:
        """Why each job with tasks left waits, walking each user's jobs in their order."""
        for user in self.users.values():
            for job in user.jobs:
                can = self.board.can_ever_hold(job.demand.request, self._until(job))
                job.eligible = job.room if can else 0
        others = self._others_ahead()
        waits: dict[str, Wait] = {}
        for name, user in self.users.items():
            own = 0  # the user's tasks ahead of the job, in better-ranked jobs
            for job in user.jobs:
                if job.left > 0:
                    waits[job.demand.job_id] = self._why(user, job, own, others[name])
                own = _capped(own + job.eligible, user.room)
        return waits

    def _why(self, user: _User, job: _Job, own: int, others: int) -> Wait:
        """The most binding reason, in `WaitingReason`'s order."""
        d, need = job.demand, job.demand.request
        if d.max_in_flight is not None and job.room == 0:
            return Throttled(d.in_flight + job.placed, d.max_in_flight)
        if user.room == 0 and user.state.cap is not None:
            return UserCapped(user.state.in_flight + user.placed, user.state.cap)
        if not self.board.can_ever_hold(need):
            largest = self.board.closest(need, by_capacity=True)
            return TooLarge(need, largest.host_id, largest.capacity)
        if not self.board.can_ever_hold(need, until := self._until(job)):
            return self._ends_too_soon(job, until)
        if (held := self.board.held_for(d.job_id)) is not None:  # it starts there, first
            return WaitsForResources(need, held.host_id, held.free, held.host_id)
        if (holder := self.board.holder_of(need, besides=d.job_id)) is not None:
            return Reserved(need, holder[1].host_id, holder[0])
        if own == 0 and others == 0:
            closest = self.board.closest(need)
            return WaitsForResources(need, closest.host_id, closest.free)
        return FairShare(others) if own == 0 else Priority(own, others)

    def _ends_too_soon(self, job: _Job, until: float | None) -> EndsTooSoon:
        """Why a job waits whose tasks every host that could hold them ends before."""
        d = job.demand
        last = self.board.last_to_end(d.request)
        runs = None if until is None or math.isinf(until) else until - self.round_.now
        left = max(0.0, (last.ends_at or self.round_.now) - self.round_.now)
        return EndsTooSoon(d.request, runs, d.walltime_s is not None, last.host_id, left)

    def _others_ahead(self) -> dict[str, int]:
        """For each user, how many tasks of other users the order serves before the user's
        next: each other user below them is served until their level reaches theirs (at the
        cost of their next task each), as many as they have eligible."""
        queues = {name: self._queue(user) for name, user in self.users.items()}
        return {
            name: sum(
                _tasks_below(queues[name][0], *queue)
                for other, queue in queues.items()
                if other != name
            )
            for name in self.users
        }

    def _queue(self, user: _User) -> tuple[float, float, int]:
        """A user's level, what one more task raises it by, and their eligible tasks."""
        first = next((job for job in user.jobs if job.eligible > 0), None)
        count = _capped(sum(job.eligible for job in user.jobs), user.room)
        step = self.pricing.cost(first.demand.request) if first else 1.0
        return user.level, step / user.state.share, count


def _oldest_first(job: _Job) -> tuple[float, str]:
    return job.demand.waiting_since, job.demand.job_id


def _capped(count: int, cap: int | None) -> int:
    return count if cap is None else min(count, cap)


def _tasks_below(level: float, other_level: float, step: float, eligible: int) -> int:
    """How many of another user's `eligible` tasks, `step` apart from `other_level`, come
    before `level` (ties go either way: none counted)."""
    gap = level - other_level
    if gap <= 1e-9 or step <= 0:
        return 0
    return min(eligible, math.ceil(gap / step - 1e-9))
