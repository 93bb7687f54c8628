"""The scheduling planner: every rule of `shared/domain/scheduling`, pure.

Fair share is checked over a stream of rounds by a tiny simulation (`_simulate`: each round
is one second; tasks end, usage is charged, the planner places, tasks start), the rest on
single rounds; no over-commit and the reasons' consistency are properties over generated
pools (hypothesis).
"""

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    WaitingReason,
    WaitsForResources,
)
from shared.domain.scheduling.resources import NOTHING, Pricing, Resources

R = Resources.of
NOW = 100_000.0


def _hosts(*cpus: float, memory_mb: int = 65536) -> list[HostState]:
    return [HostState.idle(f"h{n}", R(c, memory_mb)) for n, c in enumerate(cpus, 1)]


def _placed(result: Plan, job_id: str, staged: bool = False) -> int:
    return sum(a.count for a in result.assignments if a.job_id == job_id and a.staged == staged)


def _on(result: Plan, host_id: str) -> list[Assignment]:
    return [a for a in result.assignments if a.host_id == host_id and not a.staged]


# -- resources and usage ----------------------------------------------------------------------


def test_when_resources_are_compared__every_part_must_fit() -> None:
    assert R(2, 1024).fits_in(R(2, 1024))
    assert not R(2, 1024).fits_in(R(4, 512))
    assert not R(1, 0, 1).fits_in(R(64, 65536))
    assert R(0.5).millicpus == 500
    assert R(2, 4096, 1).describe() == "2 cpus, 4096 MiB, 1 gpu"
    assert R(1).describe() == "1 cpu"


def test_when_a_task_takes_a_gpu_or_much_memory__it_costs_its_dominant_share_in_cpus() -> None:
    pricing = Pricing.of_pool(R(64, 262144, 4))  # 16 cpus per gpu, 4096 MiB per cpu

    assert pricing.cost(R(1, 2048)) == 1
    assert pricing.cost(R(1, 16384)) == 4
    assert pricing.cost(R(1, 0, 1)) == 16


def test_when_half_a_life_passes__usage_halves_and_a_steady_user_converges_to_what_it_holds() -> (
    None
):
    assert fairshare.decayed(100.0, 60, half_life_s=60) == pytest.approx(50.0)
    usage = 0.0
    for _ in range(3600):
        usage = fairshare.charged(usage, held_cost=8, elapsed_s=1, half_life_s=300)
    assert fairshare.recent(usage, 300) == pytest.approx(8, rel=1e-3)


def test_when_usage_is_charged_in_steps_of_any_length__it_comes_to_the_same() -> None:
    by_seconds = 1000.0
    for _ in range(10):
        by_seconds = fairshare.charged(by_seconds, 4, 1, 120)

    assert fairshare.charged(1000.0, 4, 10, 120) == pytest.approx(by_seconds)
    assert fairshare.charged(1000.0, 4, 10, 0) == 0  # no half-life: no history


# -- validation -------------------------------------------------------------------------------


def test_when_inputs_contradict_themselves__they_are_refused() -> None:
    with pytest.raises(ValueError, match="free device ids"):
        HostState("h", R(8, 0, 2), R(8, 0, 2), ("gpu0",))
    with pytest.raises(ValueError, match="needs some CPU"):
        JobDemand("j", "u", 1, R(0, 1024))
    with pytest.raises(ValueError, match="share"):
        UserState("u", share=0)


# -- fair share over a stream of rounds -------------------------------------------------------


_SIMULATED = Settings(half_life_s=300)


@dataclass
class _Running:
    user: str
    host: str
    need: Resources
    devices: tuple[str, ...]
    ends: int


@dataclass
class _Pool:
    """A simulated pool: hosts' capacities and the tasks running on them."""

    capacity: dict[str, Resources]
    running: list[_Running] = field(default_factory=list)

    def state(self) -> list[HostState]:
        hosts = []
        for host_id, capacity in self.capacity.items():
            taken = [r for r in self.running if r.host == host_id]
            free = capacity - sum((r.need for r in taken), NOTHING)
            used = {d for r in taken for d in r.devices}
            ids = tuple(f"gpu{n}" for n in range(capacity.gpus) if f"gpu{n}" not in used)
            hosts.append(HostState(host_id, capacity, free, ids))
        return hosts

    def held(self, user: str) -> Resources:
        return sum((r.need for r in self.running if r.user == user), NOTHING)


def _simulate(
    pool: _Pool,
    jobs: Sequence[JobDemand],
    seconds: Mapping[str, int],
    shares: Mapping[str, float],
    rounds: int,
    config: Settings = _SIMULATED,
) -> dict[str, float]:
    """Each user's part of the pool's CPU-seconds over `rounds` one-second rounds, every job
    waiting for ever (its tasks last `seconds[job]`)."""
    pricing = Pricing.of_pool(sum(pool.capacity.values(), NOTHING))
    usage = dict.fromkeys(shares, 0.0)
    used = dict.fromkeys(shares, 0.0)
    owner = {job.job_id: job.user for job in jobs}
    for t in range(rounds):
        for user in shares:  # the second that ended now
            held = pool.held(user)
            usage[user] = fairshare.charged(usage[user], pricing.cost(held), 1, config.half_life_s)
            used[user] += held.millicpus / 1000
        pool.running = [r for r in pool.running if r.ends > t]
        users = {
            u: UserState(u, s, usage[u], sum(r.user == u for r in pool.running), pool.held(u))
            for u, s in shares.items()
        }
        result = plan(Round(float(t), pool.state(), jobs, users), config)
        for a in result.assignments:
            need = next(j.request for j in jobs if j.job_id == a.job_id)
            pool.running += [
                _Running(owner[a.job_id], a.host_id, need, d, t + seconds[a.job_id])
                for d in a.gpu_ids
            ]
    total = sum(used.values())
    return {user: part / total for user, part in used.items()}


def test_when_two_users_with_equal_shares_compete__each_gets_half_of_the_pool() -> None:
    pool = _Pool({"h1": R(4, 8192), "h2": R(4, 8192)})
    jobs = [JobDemand("a", "alice", 10**6), JobDemand("b", "bob", 10**6, waiting_since=5)]

    parts = _simulate(pool, jobs, {"a": 3, "b": 1}, {"alice": 1, "bob": 1}, rounds=600)

    assert parts["alice"] == pytest.approx(0.5, abs=0.05)
    assert parts["bob"] == pytest.approx(0.5, abs=0.05)


def test_when_shares_are_3_to_1__the_pool_is_shared_75_to_25() -> None:
    pool = _Pool({"h1": R(8, 16384), "h2": R(8, 16384)})
    jobs = [JobDemand("a", "alice", 10**6), JobDemand("b", "bob", 10**6)]

    parts = _simulate(pool, jobs, {"a": 2, "b": 5}, {"alice": 3, "bob": 1}, rounds=600)

    assert parts["alice"] == pytest.approx(0.75, abs=0.05)
    assert parts["bob"] == pytest.approx(0.25, abs=0.05)


def test_when_one_round_finds_the_pool_empty__it_shares_it_out_by_the_shares() -> None:
    """Each task placed raises its user's level at once: a burst of free capacity is not all
    given to whoever was lowest when the round began."""
    users = {"alice": UserState("alice", share=3), "bob": UserState("bob", share=1)}
    jobs = [JobDemand("a", "alice", 100), JobDemand("b", "bob", 100)]

    result = plan(Round(NOW, _hosts(8, 8), jobs, users))

    assert (_placed(result, "a"), _placed(result, "b")) == (12, 4)
    assert result.levels == {"alice": 4.0, "bob": 4.0}


def test_when_a_user_is_alone__they_get_the_whole_pool() -> None:
    pool = _Pool({"h1": R(4, 8192), "h2": R(16, 65536)})
    jobs = [JobDemand("a", "alice", 10**6, R(1, 1024))]

    parts = _simulate(pool, jobs, {"a": 3}, {"alice": 1, "bob": 5}, rounds=60)
    one_round = plan(Round(NOW, pool.state(), jobs))

    assert parts["alice"] == 1
    assert sum(a.count for a in one_round.assignments) == 0  # the pool is full: nothing idle
    pool.running.clear()
    assert sum(a.count for a in plan(Round(NOW, pool.state(), jobs)).assignments) == 20


def test_when_bob_submits_one_task_behind_alices_backlog__it_takes_the_first_free_slot() -> None:
    """Fair share at the first free slot: it frees; Bob's one task takes it, not Alice's ninth."""
    host = HostState("h1", R(4, 8192), R(1, 8192 - 3 * 1024))
    alice = UserState("alice", usage=3 * 60.0, in_flight=3, held=R(3, 3 * 1024))
    jobs = [
        JobDemand("a", "alice", 5000, R(1, 1024), waiting_since=0, in_flight=3),
        JobDemand("b", "bob", 1, R(1, 1024), waiting_since=NOW - 1),
    ]

    result = plan(Round(NOW, [host], jobs, {"alice": alice}))

    assert result.assignments == (Assignment("b", "h1", 1, ((),)),)
    assert result.waits["a"] == WaitsForResources(R(1, 1024), "h1", R(0, 4096))


def test_when_a_user_has_used_much_lately__a_newcomer_is_served_first() -> None:
    users = {"old": UserState("old", usage=1e6), "new": UserState("new")}
    jobs = [JobDemand("o", "old", 10, waiting_since=0), JobDemand("n", "new", 10)]

    result = plan(Round(NOW, _hosts(4), jobs, users))

    assert _placed(result, "n") == 4
    assert result.levels["old"] > result.levels["new"]


# -- priority and age -------------------------------------------------------------------------


def test_when_a_user_has_jobs_of_several_priorities__the_highest_goes_first() -> None:
    jobs = [
        JobDemand("low", "alice", 10, priority=-1, waiting_since=NOW - 60),
        JobDemand("high", "alice", 3, priority=5, waiting_since=NOW - 10),
        JobDemand("mid", "alice", 10, priority=0, waiting_since=NOW - 30),
    ]

    result = plan(Round(NOW, _hosts(5), jobs))

    assert (_placed(result, "high"), _placed(result, "mid"), _placed(result, "low")) == (3, 2, 0)
    assert result.waits["low"] == Priority(ahead=8, others_ahead=0)
    assert "8 tasks of the user's higher-ranked jobs ahead" in result.waits["low"].message()


def test_when_a_low_priority_job_waits_long_enough__age_lifts_it_over_newer_ones() -> None:
    """Priority 5 above it, 10 points an hour: after half an hour it goes first."""
    config = Settings(age_per_hour=10)

    def first_after(waited_s: float) -> str:
        jobs = [
            JobDemand("old", "alice", 1, priority=0, waiting_since=NOW - waited_s),
            JobDemand("new", "alice", 1, priority=5, waiting_since=NOW),
        ]
        result = plan(Round(NOW, _hosts(1), jobs), config)
        return result.assignments[0].job_id

    assert first_after(1700) == "new"
    assert first_after(1900) == "old"


# -- placement --------------------------------------------------------------------------------


def test_when_hosts_differ__a_task_goes_where_it_fits_most_tightly() -> None:
    hosts = [HostState("big", R(32, 65536), R(32, 65536)), HostState("small", R(4), R(2))]

    result = plan(Round(NOW, hosts, [JobDemand("j", "u", 3, R(1))]))

    assert [(a.host_id, a.count) for a in result.assignments] == [("small", 2), ("big", 1)]


def test_when_gpu_tasks_are_placed__each_gets_devices_of_its_own() -> None:
    hosts = [
        HostState("g1", R(16, 65536, 4), R(16, 65536, 3), ("gpu0", "gpu2", "gpu3")),
        HostState.idle("cpu", R(8, 65536)),
    ]
    jobs = [
        JobDemand("two", "alice", 1, R(2, 4096, 2), waiting_since=NOW - 3),
        JobDemand("one", "bob", 5, R(1, 4096, 1), waiting_since=NOW - 2),
        JobDemand("plain", "carol", 9, R(1, 1024), waiting_since=NOW - 1),
    ]

    result = plan(Round(NOW, hosts, jobs))

    devices = [d for a in _on(result, "g1") for task in a.gpu_ids for d in task]
    assert sorted(devices) == ["gpu0", "gpu2", "gpu3"]  # each once, only the free ones
    assert [a.gpu_ids for a in result.assignments if a.job_id == "two"] == [(("gpu0", "gpu2"),)]
    assert _placed(result, "one") == 1
    assert result.waits["one"] == WaitsForResources(R(1, 4096, 1), "g1", R(12, 65536 - 9216))
    # CPU-only work fills the host without GPUs first, then the GPU host's spare cores
    assert [(a.host_id, a.count) for a in result.assignments if a.job_id == "plain"] == [
        ("cpu", 8),
        ("g1", 1),
    ]


@dataclass(frozen=True)
class _Case:
    round_: Round
    settings: Settings


@st.composite
def _cases(draw: st.DrawFn) -> _Case:
    """A pool of up to 5 hosts (some with GPUs, some partly taken, some not accepting), up to
    8 jobs of 3 users with every limit, and settings."""
    hosts = []
    for n in range(draw(st.integers(0, 5))):
        gpus = draw(st.sampled_from((0, 0, 2, 4)))
        capacity = Resources(draw(st.integers(1, 16)) * 500, draw(st.integers(0, 8)) * 4096, gpus)
        free = Resources(
            draw(st.integers(-500, capacity.millicpus)),
            draw(st.integers(0, capacity.memory_mb)),
            draw(st.integers(0, gpus)),
        )
        ids = tuple(draw(st.permutations([f"gpu{g}" for g in range(gpus)]))[: free.gpus])
        staged = draw(st.integers(0, 2))
        hosts.append(HostState(f"h{n}", capacity, free, ids, draw(st.booleans()), staged))
    users = ("ann", "ben", "cat")
    jobs = [
        JobDemand(
            job_id=f"j{n}",
            user=draw(st.sampled_from(users)),
            waiting=draw(st.integers(0, 40)),
            request=Resources(
                draw(st.integers(1, 8)) * 500,
                draw(st.integers(0, 4)) * 2048,
                draw(st.sampled_from((0, 0, 0, 1, 2))),
            ),
            priority=draw(st.integers(-2, 2)),
            waiting_since=draw(st.floats(0, NOW)),
            in_flight=draw(st.integers(0, 5)),
            max_in_flight=draw(st.none() | st.integers(1, 10)),
        )
        for n in range(draw(st.integers(0, 8)))
    ]
    states = {
        u: UserState(
            u,
            share=draw(st.sampled_from((0.5, 1.0, 3.0))),
            usage=draw(st.floats(0, 1e5)),
            in_flight=draw(st.integers(0, 10)),
            held=Resources(draw(st.integers(0, 8000)), draw(st.integers(0, 16384))),
            cap=draw(st.none() | st.integers(1, 15)),
        )
        for u in users
    }
    holds = {
        f"j{draw(st.integers(0, 8))}": f"h{draw(st.integers(0, 5))}"
        for _ in range(draw(st.integers(0, 3)))
    }
    config = Settings(
        half_life_s=draw(st.sampled_from((0.0, 3600.0))),
        reserve_after_s=draw(st.sampled_from((0.0, 1e9))),
        max_reservations=draw(st.integers(0, 3)),
        prefetch=draw(st.integers(0, 2)),
    )
    stop = draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())
    return _Case(Round(NOW, hosts, jobs, states, holds, stop), config)


def _check_hosts(case: _Case, result: Plan) -> None:
    """No resource of any host over-committed; each device to one task; staged within the
    prefetch, within capacity, without GPUs; only accepting hosts."""
    by_id = {h.host_id: h for h in case.round_.hosts}
    request = {j.job_id: j.request for j in case.round_.jobs}
    for host_id, host in by_id.items():
        placed = _on(result, host_id)
        taken = sum((request[a.job_id].times(a.count) for a in placed), NOTHING)
        assert taken.fits_in(host.free.at_least_zero())
        devices = [d for a in placed for task in a.gpu_ids for d in task]
        assert len(devices) == len(set(devices)) and set(devices) <= set(host.free_gpu_ids)
        assert all(len(t) == request[a.job_id].gpus for a in placed for t in a.gpu_ids)
        staged = [a for a in result.assignments if a.host_id == host_id and a.staged]
        assert sum(a.count for a in staged) <= max(0, case.settings.prefetch - host.staged)
        assert all(request[a.job_id].fits_in(host.capacity) for a in staged)
        assert all(request[a.job_id].gpus == 0 for a in staged)
        assert host.accepting or not (placed or staged)


def _check_limits(case: _Case, result: Plan) -> None:
    """No job over its waiting tasks or its throttle, no user over their cap."""
    per_user: dict[str, int] = defaultdict(int)
    for job in case.round_.jobs:
        placed = result.placed(job.job_id)
        per_user[job.user] += placed
        assert placed <= job.waiting
        if job.max_in_flight is not None:
            assert placed <= max(0, job.max_in_flight - job.in_flight)
    for user, placed in per_user.items():
        state = case.round_.users[user]
        if state.cap is not None:
            assert placed <= max(0, state.cap - state.in_flight)


def _free_after(case: _Case, result: Plan) -> dict[str, Resources]:
    request = {j.job_id: j.request for j in case.round_.jobs}
    return {
        h.host_id: h.free.at_least_zero()
        - sum((request[a.job_id].times(a.count) for a in _on(result, h.host_id)), NOTHING)
        for h in case.round_.hosts
        if h.accepting
    }


def _check_reasons(case: _Case, result: Plan) -> None:
    """A reason for every job with tasks left, none for the others; a job waiting on fair
    share, priority or resources fits nowhere's free capacity after the round (nothing it
    could use is left idle; a job with a host held for it may fit one held for another);
    one waiting on a reservation fits only what is held."""
    free = _free_after(case, result)
    for job in case.round_.jobs:
        left = job.waiting - result.placed(job.job_id)
        assert (job.job_id in result.waits) == (left > 0)
        why = result.waits.get(job.job_id)
        if isinstance(why, WaitsForResources) and why.reserved_host:
            assert result.reservations[job.job_id] == why.reserved_host
            held = {h for j, h in result.reservations.items() if j != job.job_id}
            assert not any(job.request.fits_in(f) for h, f in free.items() if h not in held)
        elif isinstance(why, WaitsForResources | FairShare | Priority):
            assert not any(job.request.fits_in(f) for f in free.values())
        if isinstance(why, Reserved):
            assert job.request.fits_in(free[why.host_id])
            assert result.reservations[why.for_job] == why.host_id
    assert len(result.reservations) <= max(
        case.settings.max_reservations, len(case.round_.reservations)
    )


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_cases())
def test_whatever_the_pool_and_the_jobs__no_host_is_over_committed_and_every_wait_is_true(
    case: _Case,
) -> None:
    result = plan(case.round_, case.settings)

    _check_hosts(case, result)
    _check_limits(case, result)
    _check_reasons(case, result)


def test_when_a_job_has_a_billion_tasks_waiting__the_round_is_the_same_as_for_a_thousand() -> None:
    """The planner looks at jobs, not tasks: the cost does not grow with the backlog."""
    hosts = _hosts(8, 8)
    small = plan(Round(NOW, hosts, [JobDemand("j", "u", 1000), JobDemand("k", "v", 3)]))
    large = plan(Round(NOW, hosts, [JobDemand("j", "u", 10**9), JobDemand("k", "v", 3)]))

    assert large.assignments == small.assignments
    assert large.waits == small.waits


# -- backfill and reservations ----------------------------------------------------------------


def _busy_host(host_id: str, cpus: float, free: float) -> HostState:
    return HostState(host_id, R(cpus, 65536), R(free, 65536))


def test_when_a_large_request_waits__smaller_ones_behind_it_run_on_what_is_free() -> None:
    jobs = [
        JobDemand("big", "alice", 1, R(8), waiting_since=NOW - 60),
        JobDemand("small", "bob", 10, R(1), waiting_since=NOW - 30),
    ]
    users = {"bob": UserState("bob", usage=1e5)}  # bob is behind alice in fair share

    result = plan(Round(NOW, [_busy_host("h1", 8, 3)], jobs, users))

    assert _placed(result, "small") == 3
    assert result.waits["big"] == WaitsForResources(R(8), "h1", R(0, 65536))
    assert result.reservations == {}  # it has not waited reserve_after_s yet


def test_when_a_large_request_has_waited_past_the_threshold__a_host_is_held_for_it() -> None:
    jobs = [
        JobDemand("big", "alice", 2, R(8), waiting_since=NOW - 700),
        JobDemand("small", "bob", 10, R(1), waiting_since=NOW - 30),
    ]
    hosts = [_busy_host("h1", 8, 3), _busy_host("h2", 8, 5)]

    result = plan(Round(NOW, hosts, jobs, {"bob": UserState("bob", usage=1e5)}))

    assert result.reservations == {"big": "h2"}  # the least left to drain
    assert _on(result, "h2") == []  # nothing takes what it needs
    assert _placed(result, "small") == 3  # h1 still backfills
    assert result.waits["big"] == WaitsForResources(R(8), "h2", R(5, 65536), reserved_host="h2")
    assert result.waits["small"] == Reserved(R(1), "h2", "big")
    assert "held for job big" in result.waits["small"].message()


def test_when_a_held_host_has_drained__the_large_request_starts_there_first() -> None:
    """Even though its user is far above the other in fair share: the reservation wins."""
    jobs = [
        JobDemand("big", "alice", 2, R(8), waiting_since=NOW - 700),
        JobDemand("small", "bob", 10, R(1), waiting_since=NOW - 30),
    ]
    users = {"alice": UserState("alice", usage=1e7)}
    hosts = [_busy_host("h1", 8, 0), _busy_host("h2", 8, 8)]

    result = plan(Round(NOW, hosts, jobs, users, reservations={"big": "h2"}))

    assert _on(result, "h2") == [Assignment("big", "h2", 1, ((),))]
    assert result.reservations == {}


def test_when_a_held_host_is_short_of_gpus__cpu_work_still_uses_what_the_hold_leaves() -> None:
    host = HostState("g", R(16, 65536, 4), R(12, 65536, 1), ("gpu3",))
    jobs = [
        JobDemand("gpu", "alice", 1, R(4, 16384, 2), waiting_since=0),
        JobDemand("cpu", "bob", 20, R(1, 1024), waiting_since=1),
    ]

    result = plan(Round(NOW, [host], jobs, reservations={"gpu": "g"}))

    assert result.reservations == {"gpu": "g"}
    assert _placed(result, "cpu") == 8  # 12 free - 4 held for the gpu task
    assert result.waits["cpu"] == Reserved(R(1, 1024), "g", "gpu")


def test_when_the_job_a_host_is_held_for_is_throttled__the_hold_is_let_go() -> None:
    jobs = [JobDemand("big", "a", 2, R(8), 0, 0.0, in_flight=1, max_in_flight=1)]

    result = plan(Round(NOW, [_busy_host("h1", 8, 2)], jobs, reservations={"big": "h1"}))

    assert result.reservations == {}
    assert result.waits["big"] == Throttled(in_flight=1, limit=1)


def _starts_of_big(reserve_after_s: float) -> int | None:
    """A 4-cpu host, a user whose 1-cpu tasks of 5 s keep it busy, and a 4-cpu task behind:
    the second at which the large task starts (None: never, in 10 minutes)."""
    pool = _Pool({"h1": R(4, 8192)})
    pool.running = [_Running("bob", "h1", R(1), (), ends) for ends in (1, 2, 3, 4)]
    jobs = [
        JobDemand("big", "alice", 1, R(4), waiting_since=0),
        JobDemand("small", "bob", 10**6, R(1), waiting_since=0),
    ]
    config = Settings(half_life_s=0, reserve_after_s=reserve_after_s)
    reservations: dict[str, str] = {}
    for t in range(600):
        pool.running = [r for r in pool.running if r.ends > t]
        users = {"bob": UserState("bob", in_flight=len(pool.running), held=pool.held("bob"))}
        result = plan(Round(float(t), pool.state(), jobs, users, reservations), config)
        if result.placed("big"):
            return t
        reservations = dict(result.reservations)
        pool.running += [
            _Running("bob", a.host_id, R(1), (), t + 5)
            for a in result.assignments
            for _ in a.gpu_ids
        ]
    return None


def test_when_small_tasks_keep_a_host_busy__a_reservation_bounds_the_large_ones_wait() -> None:
    """Without a reservation the 4-cpu task never finds the host empty; with one, it starts
    within reserve_after_s plus the longest task running when the host was held (5 s)."""
    assert _starts_of_big(reserve_after_s=math.inf) is None
    started = _starts_of_big(reserve_after_s=30)
    assert started is not None and 30 <= started <= 30 + 5 + 1


def test_when_the_worker_prefetches__full_hosts_are_handed_that_many_more_to_set_up() -> None:
    hosts = [_busy_host("h1", 4, 0), replace(_busy_host("h2", 4, 1), staged=1)]
    jobs = [JobDemand("j", "u", 10, R(1)), JobDemand("g", "v", 5, R(1, 0, 1))]

    result = plan(Round(NOW, hosts, jobs), Settings(prefetch=2))

    assert _placed(result, "j") == 1 and _placed(result, "j", staged=True) == 3
    assert [(a.host_id, a.count) for a in result.assignments if a.staged] == [("h1", 2), ("h2", 1)]
    assert _placed(result, "g", staged=True) == 0  # a GPU task is never staged
    assert result.waits["g"] == TooLarge(R(1, 0, 1), "h1", R(4, 65536))


def _staged_host(host_id: str, cpus: float, staged: Mapping[str, int]) -> HostState:
    """A host whose capacity runs tasks, with `staged` tasks of one CPU each per owner."""
    of = tuple((owner, R(count)) for owner, count in staged.items())
    return HostState(host_id, R(cpus, 65536), NOTHING, staged=sum(staged.values()), staged_of=of)


def test_a_task_of_a_user_served_first_goes_ahead_of_staged_work_of_one_served_after() -> None:
    """Alice holds the host and has 4 tasks staged on it; Bob, who holds nothing, comes: his
    task takes the next capacity freed there, before hers, not after them."""
    hosts = [_staged_host("h1", 4, {"alice": 4})]
    users = {"alice": UserState("alice", held=R(8), in_flight=8)}
    jobs = [JobDemand("bob-echo", "bob", 1), JobDemand("alice-sleeps", "alice", 4)]

    result = plan(Round(NOW, hosts, jobs, users), Settings(prefetch=4))

    assert [(a.job_id, a.host_id, a.count, a.staged) for a in result.assignments] == [
        ("bob-echo", "h1", 1, False)
    ]


def test_nothing_goes_ahead_of_staged_work_of_a_user_served_first_or_of_ones_own() -> None:
    hosts = [_staged_host("h1", 4, {"alice": 2})]
    busy = {"alice": UserState("alice", held=R(6)), "carol": UserState("carol", held=R(9))}
    jobs = [JobDemand("alice-more", "alice", 3), JobDemand("carol-job", "carol", 1)]

    result = plan(Round(NOW, hosts, jobs, busy), Settings(prefetch=2))

    assert result.assignments == ()  # alice's own order; carol is served after alice


def test_what_goes_ahead_is_bounded_by_the_staged_work_it_passes() -> None:
    """Two staged CPUs of alice's let two tasks of bob's ahead, not three; one already placed
    ahead (what the host holds beyond its capacity) counts."""
    hosts = [_staged_host("h1", 4, {"alice": 2})]
    users = {"alice": UserState("alice", held=R(6))}
    jobs = [JobDemand("bob-job", "bob", 5)]

    assert _placed(plan(Round(NOW, hosts, jobs, users)), "bob-job") == 2
    passed_once = [replace(hosts[0], ahead=R(1))]
    assert _placed(plan(Round(NOW, passed_once, jobs, users)), "bob-job") == 1


# -- every reason, with its numbers -----------------------------------------------------------


def test_when_an_emergency_stop_is_in_force__nothing_starts_and_every_job_says_why() -> None:
    jobs = [JobDemand("j", "u", 3), JobDemand("k", "v", 0)]

    result = plan(Round(NOW, _hosts(8), jobs, emergency_stop=True))

    assert result.assignments == ()
    assert result.waits == {"j": EmergencyStop()}


def test_when_no_host_takes_work__the_reason_counts_the_hosts() -> None:
    shut = [replace(h, accepting=False) for h in _hosts(8, 8)]

    assert plan(Round(NOW, shut, [JobDemand("j", "u", 1)])).waits["j"] == NoHost(hosts=2)
    assert plan(Round(NOW, [], [JobDemand("j", "u", 1)])).waits["j"].message() == (
        "no host in the pool"
    )


def test_when_a_job_reaches_its_max_in_flight__it_is_throttled_with_its_numbers() -> None:
    jobs = [JobDemand("j", "u", 10, in_flight=2, max_in_flight=5)]

    result = plan(Round(NOW, _hosts(16), jobs))

    assert _placed(result, "j") == 3
    assert result.waits["j"] == Throttled(in_flight=5, limit=5)


def test_when_a_user_reaches_their_cap__every_job_of_theirs_says_so() -> None:
    users = {"u": UserState("u", in_flight=1, held=R(1), cap=4)}
    jobs = [JobDemand("j", "u", 10), JobDemand("k", "u", 10, waiting_since=1)]

    result = plan(Round(NOW, _hosts(16), jobs, users))

    assert _placed(result, "j") == 3
    assert result.waits["j"] == result.waits["k"] == UserCapped(in_flight=4, cap=4)


def test_when_no_host_can_ever_hold_a_request__the_reason_names_the_largest_host() -> None:
    hosts = [HostState.idle("small", R(8, 16384)), HostState.idle("large", R(32, 131072))]
    jobs = [JobDemand("huge", "u", 1, R(64, 1024))]

    why = plan(Round(NOW, hosts, jobs)).waits["huge"]

    assert why == TooLarge(R(64, 1024), "large", R(32, 131072))
    assert why.message() == (
        "no host can ever hold it: needs 64 cpus, 1024 MiB; the largest host, large, has "
        "32 cpus, 131072 MiB"
    )


def test_when_others_come_first__fair_share_counts_the_tasks_ahead() -> None:
    users = {"heavy": UserState("heavy", in_flight=8, held=R(8))}
    hosts = [_busy_host("h1", 8, 0)]
    jobs = [JobDemand("j", "heavy", 5), JobDemand("k", "light", 5)]

    result = plan(Round(NOW, hosts, jobs, users))

    assert result.waits["k"] == WaitsForResources(R(1), "h1", R(0, 65536))
    assert result.waits["j"] == FairShare(ahead=5)  # light's 5 all come before heavy's next
    assert result.waits["j"].message() == "fair share: 5 tasks of other users ahead"
    assert {w.reason for w in result.waits.values()} <= set(WaitingReason)


# -- pilots: hosts that end ---------------------------------------------------------------------


def test_when_a_pilot_ends_before_a_task_could__the_task_goes_where_it_has_the_time() -> None:
    soon = replace(HostState.idle("pilot-soon", R(4)), ends_at=NOW + 600)
    later = replace(HostState.idle("pilot-later", R(8)), ends_at=NOW + 7200)
    hosts = [soon, later]
    hour = JobDemand("hour", "u", 3, R(1), walltime_s=3600, waiting_since=NOW)
    unsaid = JobDemand("unsaid", "v", 1, R(1), waiting_since=NOW, restartable=True)

    result = plan(Round(NOW, hosts, [hour, unsaid]))

    assert {a.host_id for a in result.assignments if a.job_id == "hour"} == {"pilot-later"}
    assert _placed(result, "unsaid") == 1  # restartable, length unknown: a pilot's too


def test_when_no_host_lasts_long_enough__the_task_waits_for_a_host_that_does() -> None:
    soon = replace(HostState.idle("pilot-soon", R(4)), ends_at=NOW + 600)
    hour = JobDemand("hour", "u", 1, R(1), walltime_s=3600, waiting_since=NOW)

    result = plan(Round(NOW, [soon], [hour]))

    assert result.assignments == ()
    assert result.waits["hour"].reason is WaitingReason.HOST_ENDS


def test_when_a_task_is_not_restartable_and_of_unknown_length__no_host_that_ends_gets_it() -> None:
    ending = replace(HostState.idle("pilot-ending", R(4)), ends_at=NOW + 470)
    sleep = JobDemand("sleep-600", "alice", 1, R(1), waiting_since=NOW)

    alone = plan(Round(NOW, [ending], [sleep]))
    beside = plan(Round(NOW, [ending, HostState.idle("h1", R(1))], [sleep]))

    assert alone.assignments == ()
    wait = alone.waits["sleep-600"]
    assert wait == EndsTooSoon(R(1), None, False, "pilot-ending", 470.0)
    assert wait.reason is WaitingReason.HOST_ENDS
    assert "not restartable, no walltime" in wait.message()
    assert [(a.host_id, a.count) for a in beside.assignments] == [("h1", 1)]


def test_when_a_job_has_no_walltime__what_its_finished_tasks_took_decides_where_it_fits() -> None:
    ending = replace(HostState.idle("pilot-ending", R(4)), ends_at=NOW + 470)
    short = JobDemand("short", "u", 2, R(1), waiting_since=NOW, expected_s=expected_runtime(90))
    long = JobDemand("long", "v", 2, R(1), waiting_since=NOW, expected_s=expected_runtime(600))

    result = plan(Round(NOW, [ending], [short, long]))

    assert expected_runtime(90) == 90 * 1.5 + 60 and expected_runtime(None) is None
    assert _placed(result, "short") == 2  # 195 s: ends before the pilot does
    assert _placed(result, "long") == 0  # 960 s: would not
    wait = result.waits["long"]
    assert wait == EndsTooSoon(R(1), 960.0, False, "pilot-ending", 470.0)
    assert "960 s (what its job's finished tasks took)" in wait.message()


def test_when_a_walltime_outlasts_every_pilot__the_reason_names_the_one_that_lasts_longest() -> (
    None
):
    soon = replace(HostState.idle("pilot-soon", R(4)), ends_at=NOW + 600)
    later = replace(HostState.idle("pilot-later", R(4)), ends_at=NOW + 1200)
    day = JobDemand("day", "u", 1, R(1), walltime_s=86400, waiting_since=NOW)

    result = plan(Round(NOW, [soon, later], [day]))

    assert result.waits["day"] == EndsTooSoon(R(1), 86400.0, True, "pilot-later", 1200.0)
    assert "(its walltime)" in result.waits["day"].message()


def test_when_a_host_held_for_a_job_ends_too_soon__the_job_is_not_placed_there() -> None:
    ending = replace(HostState.idle("pilot-ending", R(4)), ends_at=NOW + 470)
    sleep = JobDemand("sleep-600", "alice", 1, R(1), waiting_since=NOW - 3600)

    result = plan(Round(NOW, [ending], [sleep], reservations={"sleep-600": "pilot-ending"}))

    assert result.assignments == () and result.reservations == {}


def test_when_a_job_is_not_stageable__nothing_of_it_is_handed_beyond_free_capacity() -> None:
    full = replace(HostState.idle("h1", R(1)), free=NOTHING)
    long = JobDemand("long", "u", 5, R(1), waiting_since=NOW, stageable=False)
    short = JobDemand("short", "v", 5, R(1), waiting_since=NOW)

    result = plan(Round(NOW, [full], [long, short]), Settings(prefetch=2))

    assert _placed(result, "long", staged=True) == 0
    assert _placed(result, "short", staged=True) == 2
