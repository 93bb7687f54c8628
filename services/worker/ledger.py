"""What the host's commands hold of its capacity: the worker's admission by
resources, in place of a count of slots.

Each command holds its job's request (CPUs, memory, GPUs: `jobs.req_*`) and its GPU devices
from just before its spawn to the exit of its main process, as `shared/store/pool_repo.py`
counts it for the scheduler. A command starts only once its request fits in what the others
leave free; those that wait are served first come, first served (a large request is not
passed over for ever by small ones: the scheduler, which sees the whole pool, is the one
that backfills), except that a staged task (`tasks.staged`: handed to the host beyond its
free capacity, the prefetch) waits behind every task placed on capacity, whenever it came:
the scheduler places a task ahead of staged ones when fair share serves its user first, and
it must take the next capacity freed here. A task placed on capacity counts from the moment
its work message is delivered (`expect`: the consumer, in delivery order), not only once its
command asks for its hold after its take and setup: a staged command never takes what such a
task is on its way to (the scheduler queues a round's placed tasks before its staged ones).
A request larger than the whole host can never start: `why_never` says so before anyone
waits for it.

GPU devices are never shared. A task placed with devices (`tasks.gpu_ids`) waits for those;
one that asks for GPUs without any named (work from the pool queue, which nobody placed)
gets the first free ones of the host. A command sees its own devices only
(`CUDA_VISIBLE_DEVICES`); on a host with GPUs, one that asked for none sees none.
"""

import asyncio
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from shared.domain.scheduling.resources import NOTHING, Resources
from shared.host.capacity import HostCapacity


@dataclass(frozen=True)
class _Waiter:
    request: Resources
    devices: tuple[str, ...]
    granted: "asyncio.Future[tuple[str, ...]]"


class Ledger:
    """The host's capacity and what its commands hold of it."""

    def __init__(self, capacity: HostCapacity) -> None:
        self.capacity = capacity
        self._held = NOTHING
        self._busy: set[str] = set()  # devices held
        self._placed: deque[_Waiter] = deque()  # waiting, placed on capacity
        self._staged: deque[_Waiter] = deque()  # waiting, staged: served after those
        #: Tasks placed on capacity whose commands have not asked for their hold yet (being
        #: taken, set up): task id -> request, and their sum.
        self._expected: dict[str, Resources] = {}
        self._expected_sum = NOTHING

    @property
    def free(self) -> Resources:
        return self.capacity.resources - self._held

    def why_never(self, request: Resources, devices: Sequence[str] = ()) -> str | None:
        """Why a command of `request` (placed with `devices`) can never start here, or None:
        what it asks for is more than the whole host, or names devices it does not have."""
        gpus = self.capacity.gpu_ids
        strangers = [d for d in devices if d not in gpus]
        if strangers:
            have = f"gpus {','.join(gpus)}" if gpus else "no gpu"
            return f"it was placed on gpu {','.join(strangers)}, and this host has {have}"
        amount = _amount(request, devices)
        if not amount.fits_in(self.capacity.resources):
            return (
                f"it asks for {request.describe()}, more than this host's whole capacity"
                f" ({self.capacity.describe()})"
            )
        return None

    def expect(self, key: str, request: Resources) -> None:
        """A task placed on capacity (`key`: its id) is on its way to its command: staged
        commands leave it `request` from now on, until its hold is asked for (`Hold.take`) or
        it is given up (`unexpect`)."""
        if key not in self._expected:
            self._expected[key] = request
            self._expected_sum += request

    @contextmanager
    def expecting(self, key: str, request: Resources | None) -> Iterator[None]:
        """`expect` the task `key` (if `request`: a task placed on capacity) while the block
        runs, and `unexpect` it at its end, however it ends."""
        if request is None:
            yield
            return
        self.expect(key, request)
        try:
            yield
        finally:
            self.unexpect(key)

    def unexpect(self, key: str) -> None:
        """The task `key` will not ask for its hold (it is done with, or never ran); what it
        was left goes to the staged commands waiting."""
        if self._forget(key):
            self._serve()

    def _forget(self, key: str) -> bool:
        request = self._expected.pop(key, None)
        if request is None:
            return False
        self._expected_sum -= request
        return True

    def fits(self, request: Resources, devices: Sequence[str] = (), staged: bool = False) -> bool:
        """Whether a command of `request` (`staged` or not) would start at once: nobody
        waits before it, and what it asks for is free."""
        return (
            not self._ahead_of(staged) and self._room(request, tuple(devices), staged) is not None
        )

    def _ahead_of(self, staged: bool) -> bool:
        """Whether some command waits before a new one (`staged` or not)."""
        return bool(self._placed or (staged and self._staged))

    def hold(
        self,
        request: Resources,
        devices: Sequence[str] = (),
        staged: bool = False,
        key: str | None = None,
    ) -> "Hold":
        """A command's hold of `request` (and `devices`), not yet taken; a `staged` task's
        waits behind every other. `key`: its task's id, expected until the hold is asked for."""
        return Hold(self, request, tuple(devices), staged, key)

    async def _acquire(
        self, request: Resources, devices: tuple[str, ...], staged: bool, key: str | None
    ) -> tuple[str, ...]:
        """Wait for `request` to fit, in turn; the devices it got. `ValueError` when it never
        can (`why_never`): it would block every command behind it."""
        if key is not None:
            self._forget(key)  # asked for now: it waits in its lane, if it must
        why = self.why_never(request, devices)
        if why is not None:
            self._serve()  # what it was left goes to others
            raise ValueError(f"cannot ever start here: {why}")
        if not self._ahead_of(staged) and (got := self._room(request, devices, staged)) is not None:
            self._take(request, got)
            return got
        waiter = _Waiter(request, devices, asyncio.get_running_loop().create_future())
        lane = self._staged if staged else self._placed
        lane.append(waiter)
        try:
            return await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._give(request, waiter.granted.result())  # granted as it was cancelled
            else:
                lane.remove(waiter)
                self._serve()  # those behind it may fit now
            raise

    def _room(
        self, request: Resources, devices: tuple[str, ...], staged: bool = False
    ) -> tuple[str, ...] | None:
        """The devices a command of `request` gets if it fits now (a `staged` one, in what the
        tasks expected leave); None if it does not."""
        free = self.free - self._expected_sum if staged else self.free
        if not _amount(request, devices).fits_in(free):
            return None
        if devices:
            return None if self._busy.intersection(devices) else devices
        idle = [d for d in self.capacity.gpu_ids if d not in self._busy]
        return tuple(idle[: request.gpus]) if len(idle) >= request.gpus else None

    def _take(self, request: Resources, devices: tuple[str, ...]) -> None:
        self._held += _amount(request, devices)
        self._busy.update(devices)

    def _give(self, request: Resources, devices: tuple[str, ...]) -> None:
        self._held -= _amount(request, devices)
        self._busy.difference_update(devices)
        self._serve()

    def _serve(self) -> None:
        """Start the waiting commands that fit now, in their order (those placed on capacity,
        then the staged ones), up to the first that does not."""
        for lane, staged in ((self._placed, False), (self._staged, True)):
            while lane:
                head = lane[0]
                got = self._room(head.request, head.devices, staged)
                if got is None:
                    return
                lane.popleft()
                self._take(head.request, got)
                head.granted.set_result(got)


def _amount(request: Resources, devices: Sequence[str]) -> Resources:
    """What a command holds: its request, its GPUs counted by the devices it was placed with
    when it was."""
    return Resources(request.millicpus, request.memory_mb, len(devices) or request.gpus)


class Hold:
    """One command's hold of the host's capacity: taken just before its spawn (waiting its
    turn), and given back once, as soon as its main process has ended (or it never ran)."""

    def __init__(
        self,
        ledger: Ledger,
        request: Resources,
        devices: tuple[str, ...],
        staged: bool = False,
        key: str | None = None,
    ) -> None:
        self._ledger, self.request, self._placed = ledger, request, devices
        self._staged, self._key = staged, key
        #: The devices it holds (None: not taken, or given back).
        self.devices: tuple[str, ...] | None = None

    async def take(self) -> None:
        self.devices = await self._ledger._acquire(
            self.request, self._placed, self._staged, self._key
        )

    def free(self) -> None:
        if self.devices is not None:
            devices, self.devices = self.devices, None
            self._ledger._give(self.request, devices)

    def environment(self) -> dict[str, str]:
        """The GPU variables of its command: its devices in `CUDA_VISIBLE_DEVICES` and
        `VIGIL_GPUS`; none visible on a host with GPUs when it holds none; nothing on a host
        without GPUs."""
        if not self._ledger.capacity.gpu_ids:
            return {}
        devices = ",".join(self.devices or ())
        return {"CUDA_VISIBLE_DEVICES": devices} | ({"VIGIL_GPUS": devices} if devices else {})
