"""A round's hosts: what each has free, best-fit placement, GPU devices and reservations.

Only hosts that accept work are on the board. It keeps each host's room (what is free, less
what a reservation holds there for another job) in two sorted lists, so that finding the
best-fit host for a request is a binary search and a short walk, not a look at every host:

- hosts without GPUs, by (room cpus, room memory): the first that holds a request is the one
  with the fewest CPUs left that still fit it (best fit, bin packing: whole hosts stay whole
  for large requests, as Nomad's binpack and Kubernetes' MostAllocated prefer);
- hosts with GPUs, by (room gpus, room cpus, room memory): a GPU task goes where the fewest
  devices are left that still fit it; a CPU-only task goes to a host without GPUs when one
  holds it, else to the GPU host with the fewest free devices (its spare cores are the
  ones no GPU task can use), so that CPU work does not strand GPUs.

Nothing is ever taken beyond a host's free capacity (`take` refuses it), and each GPU device
goes to one task.
"""

from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.domain.scheduling.model import HostState
from shared.domain.scheduling.resources import NOTHING, Resources, coverage, total

_Key = tuple[int, ...]


@dataclass(slots=True)
class Host:
    """A host during a round (the board's own, changed as tasks are placed)."""

    index: int
    host_id: str
    capacity: Resources
    free: Resources
    gpu_ids: list[str]  # free devices, in the host's order
    staged: int
    hold: Resources = NOTHING  # what a reservation keeps here for `held_for`
    held_for: str | None = None
    ends_at: float | None = None  # a pilot's end (`HostState.ends_at`)
    #: Per owner, what their staged tasks hold (`HostState.staged_of`).
    staged_of: tuple[tuple[str, Resources], ...] = ()
    #: What tasks placed ahead of the staged ones hold beyond its capacity.
    ahead: Resources = NOTHING

    def room_ahead(self, behind: Callable[[str], bool]) -> Resources:
        """What a task may take here ahead of the staged tasks of the owners `behind` says
        it goes before: what those hold, less what tasks placed ahead already took."""
        of = total(held for owner, held in self.staged_of if behind(owner))
        return (of - self.ahead).at_least_zero()

    def lasts_until(self, until: float | None) -> bool:
        """Whether it takes work until `until` (None: no time asked)."""
        return until is None or self.ends_at is None or self.ends_at >= until

    @property
    def room(self) -> Resources:
        """What a task of another job than `held_for` may take here."""
        return (self.free - self.hold).at_least_zero()

    @property
    def has_gpus(self) -> bool:
        return self.capacity.gpus > 0

    def fits(self, need: Resources) -> int:
        """How many tasks of `need` its room holds (a request takes some CPU: never
        unbounded)."""
        free, hold = self.free, self.hold
        count = max(free.millicpus - hold.millicpus, 0) // need.millicpus
        if need.memory_mb:
            count = min(count, max(free.memory_mb - hold.memory_mb, 0) // need.memory_mb)
        if need.gpus:
            count = min(count, max(free.gpus - hold.gpus, 0) // need.gpus)
        return count

    def key(self) -> _Key:
        """Its place in the board's sorted list: its room (the index makes it unique)."""
        free, hold = self.free, self.hold
        cpus = max(free.millicpus - hold.millicpus, 0)
        memory = max(free.memory_mb - hold.memory_mb, 0)
        if self.has_gpus:
            return (max(free.gpus - hold.gpus, 0), cpus, memory, self.index)
        return (cpus, memory, self.index)


def _probe(need: Resources, gpu_list: bool) -> _Key:
    """Where the first host that may hold `need` sits in a sorted list."""
    if gpu_list:
        return (need.gpus, need.millicpus, need.memory_mb, -1)
    return (need.millicpus, need.memory_mb, -1)


def _holds(key: _Key, need: Resources) -> bool:
    """Whether the room a key stands for holds `need`."""
    if len(key) == 4:
        return key[0] >= need.gpus and key[1] >= need.millicpus and key[2] >= need.memory_mb
    return need.gpus == 0 and key[0] >= need.millicpus and key[1] >= need.memory_mb


class Board:
    """The accepting hosts of a round."""

    def __init__(self, hosts: Sequence[HostState]) -> None:
        self.hosts = [
            Host(
                n,
                h.host_id,
                h.capacity,
                h.free.at_least_zero(),
                list(h.free_gpu_ids),
                h.staged,
                ends_at=h.ends_at,
                staged_of=h.staged_of,
                ahead=h.ahead,
            )
            for n, h in enumerate(x for x in hosts if x.accepting)
        ]
        self._by_id = {h.host_id: h for h in self.hosts}
        self._plain: list[_Key] = sorted(h.key() for h in self.hosts if not h.has_gpus)
        self._gpus: list[_Key] = sorted(h.key() for h in self.hosts if h.has_gpus)
        self._held: dict[str, Host] = {}  # job id -> the host held for it
        self._staging: list[tuple[int, int]] | None = None  # (staged, index), made when asked
        self._ever: dict[tuple[Resources, float | None], bool] = {}  # fixed in a round
        self._with_staged = [h for h in self.hosts if h.staged_of]
        self.capacity = total(h.capacity for h in self.hosts)

    def __bool__(self) -> bool:
        return bool(self.hosts)

    def get(self, host_id: str) -> Host | None:
        return self._by_id.get(host_id)

    # -- placing ------------------------------------------------------------------------------

    def best_fit(self, need: Resources, until: float | None = None) -> Host | None:
        """The host whose room holds `need` most tightly (see the module), taking work until
        `until` at least (a task's walltime from now), or None."""
        if need.gpus == 0 and (found := self._first(self._plain, need, False, until)):
            return found
        return self._first(self._gpus, need, True, until)

    def _first(
        self, keys: list[_Key], need: Resources, gpu_list: bool, until: float | None
    ) -> Host | None:
        for n in range(bisect_left(keys, _probe(need, gpu_list)), len(keys)):
            if _holds(keys[n], need) and (host := self.hosts[keys[n][-1]]).lasts_until(until):
                return host
        return None

    def take(self, host: Host, need: Resources, count: int = 1) -> list[tuple[str, ...]]:
        """Place `count` tasks of `need` on `host` (within its room, or its free capacity for
        the job it holds for): for each, the GPU devices it alone gets (the host's first
        free ones). One at a time or at once, the best fit goes on being the same host while
        it holds the request, so placing several at once changes nothing but the cost."""
        total = need.times(count)
        if count < 1 or not total.fits_in(host.free):
            raise AssertionError(f"{count} x {need} do not fit in {host.host_id}: {host.free}")
        ids, per = host.gpu_ids, need.gpus
        devices = [tuple(ids[n * per : (n + 1) * per]) for n in range(count)] if per else []
        with self._moving(host):
            host.free -= total
            del ids[: total.gpus]
        return devices or [()] * count

    def hold(self, host: Host, job_id: str, need: Resources) -> None:
        """Keep `need` on `host` for `job_id`: from now on others take only what it leaves."""
        with self._moving(host):
            host.hold, host.held_for = need, job_id
        self._held[job_id] = host

    def unhold(self, job_id: str) -> None:
        """The hold for `job_id` (if any) has done its work: the host is open again."""
        host = self._held.pop(job_id, None)
        if host is not None:
            with self._moving(host):
                host.hold, host.held_for = NOTHING, None

    def held(self) -> dict[str, Host]:
        """Job id -> the host held for it."""
        return dict(self._held)

    def held_for(self, job_id: str) -> Host | None:
        return self._held.get(job_id)

    def _moving(self, host: Host) -> "_Rekey":
        return _Rekey(self._gpus if host.has_gpus else self._plain, host)

    # -- reservations and prefetch ----------------------------------------------------------

    def host_to_hold(self, need: Resources, until: float | None = None) -> Host | None:
        """The host to hold for a large request: of those not held whose capacity holds it
        (and that take work until `until`), the one with the least left to drain, then the
        smallest (keep larger hosts for larger requests), then by id."""
        candidates = [
            h
            for h in self.hosts
            if h.held_for is None and need.fits_in(h.capacity) and h.lasts_until(until)
        ]
        return min(
            candidates,
            key=lambda h: (-coverage(need, h.free), h.capacity.millicpus, h.host_id),
            default=None,
        )

    def stage(self, need: Resources, prefetch: int, until: float | None = None) -> Host | None:
        """Hand one task beyond free capacity (the worker's prefetch) to a host not held, with
        fewer than `prefetch` staged, whose capacity holds it, the least staged first; never
        a GPU task (its devices are given when it is placed). The host, or None."""
        if need.gpus:
            return None
        if self._staging is None:
            self._staging = sorted((h.staged, h.index) for h in self.hosts if h.staged < prefetch)
        for n, (_, index) in enumerate(self._staging):
            host = self.hosts[index]
            if host.held_for is None and need.fits_in(host.capacity) and host.lasts_until(until):
                del self._staging[n]
                host.staged += 1
                if host.staged < prefetch:
                    insort(self._staging, (host.staged, index))
                return host
        return None

    @property
    def has_staged(self) -> bool:
        """Whether some host holds staged tasks not started yet."""
        return bool(self._with_staged)

    def ahead(
        self, need: Resources, behind: Callable[[str], bool], until: float | None = None
    ) -> Host | None:
        """Place one task of `need` ahead of staged tasks (of the owners `behind` says it goes
        before): on the host, not held for another job, whose room ahead of them holds it
        most amply; never a GPU task (its devices are given when it is placed). The host, or
        None. It takes no free capacity: it takes the next that its host frees, before them.
        """
        if need.gpus:
            return None
        best: tuple[int, Host] | None = None
        for host in self._with_staged:
            if host.held_for is not None or not host.lasts_until(until):
                continue
            room = host.room_ahead(behind)
            fits = need.fits_in(room) and need.fits_in(host.capacity)
            if fits and (best is None or room.millicpus > best[0]):
                best = (room.millicpus, host)
        if best is None:
            return None
        best[1].ahead += need
        return best[1]

    # -- what reasons say ---------------------------------------------------------------------

    def can_ever_hold(self, need: Resources, until: float | None = None) -> bool:
        """Whether some host's capacity holds `need`, taking work until `until` (looked at
        once per request shape and time)."""
        if (known := self._ever.get((need, until))) is None:
            known = self._ever[(need, until)] = any(
                need.fits_in(h.capacity) and h.lasts_until(until) for h in self.hosts
            )
        return known

    def last_to_end(self, need: Resources) -> Host:
        """Of the hosts whose capacity holds `need` (all, if none), the one that ends last
        (one that never ends first). The board must have a host."""
        able = [h for h in self.hosts if need.fits_in(h.capacity)] or self.hosts
        return max(able, key=lambda h: (h.ends_at is None, h.ends_at or 0.0, h.host_id))

    def closest(self, need: Resources, by_capacity: bool = False) -> Host:
        """The host that comes closest to holding `need` now (or ever, `by_capacity`): the
        one a waiting reason names, of those that can ever hold it when some can. The board
        must have a host."""
        able = [h for h in self.hosts if need.fits_in(h.capacity)] or self.hosts
        return min(
            able,
            key=lambda h: (-coverage(need, h.capacity if by_capacity else h.free), h.host_id),
        )

    def holder_of(self, need: Resources, besides: str) -> tuple[str, Host] | None:
        """A job other than `besides` and the host held for it, whose free capacity would
        hold `need` but for the hold."""
        return next(
            ((job, h) for job, h in self._held.items() if job != besides and need.fits_in(h.free)),
            None,
        )


@dataclass(slots=True)
class _Rekey:
    """Takes a host out of its sorted list while it changes, and puts it back in place."""

    keys: list[_Key]
    host: Host

    def __enter__(self) -> None:
        del self.keys[bisect_left(self.keys, self.host.key())]

    def __exit__(self, *_: object) -> None:
        insort(self.keys, self.host.key())
