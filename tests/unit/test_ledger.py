"""The worker's admission by resources: a command starts only once its request fits
in what the host's other commands leave free, first come first served, and never when the host
could never hold it; a command sees its own GPU devices only."""

import asyncio
import random

import pytest

from services.worker.ledger import Hold, Ledger
from shared.domain.scheduling.resources import Resources
from shared.host.capacity import HostCapacity

CPU = Resources.of(1)
QUARTER = Resources.of(0.25)


async def _taken(hold: Hold) -> Hold:
    await hold.take()
    return hold


def _waiting(ledger: Ledger, request: Resources) -> tuple[Hold, "asyncio.Future[Hold]"]:
    hold = ledger.hold(request)
    return hold, asyncio.ensure_future(_taken(hold))


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_commands_start_while_their_requests_fit_and_the_rest_wait() -> None:
    ledger = Ledger(HostCapacity.of(1, 1024))
    quarters = [ledger.hold(QUARTER) for _ in range(4)]
    for hold in quarters:
        assert ledger.fits(QUARTER)
        await hold.take()

    assert ledger.free == Resources(0, 1024, 0)
    assert not ledger.fits(QUARTER)
    fifth, starting = _waiting(ledger, QUARTER)
    await _settle()
    assert not starting.done()

    quarters[0].free()
    await _settle()
    assert starting.done() and fifth.devices == ()
    quarters[0].free()  # given back once, whatever calls it again
    assert ledger.free == Resources(0, 1024, 0)


async def test_waiting_commands_start_in_their_order_a_large_one_not_passed_over() -> None:
    ledger = Ledger(HostCapacity.of(2, 0))
    first, second = ledger.hold(CPU), ledger.hold(CPU)
    await first.take()
    await second.take()
    _, large = _waiting(ledger, Resources.of(2))
    await _settle()
    _, small = _waiting(ledger, QUARTER)
    await _settle()

    assert not ledger.fits(QUARTER)  # someone waits before it, though a quarter is not free
    first.free()
    await _settle()
    assert not large.done() and not small.done()  # the small one waits behind the large one

    second.free()
    await _settle()
    assert large.done() and not small.done()
    (await large).free()
    await _settle()
    assert small.done()


async def test_a_waiter_cancelled_lets_those_behind_it_start_and_holds_nothing() -> None:
    ledger = Ledger(HostCapacity.of(2, 0))
    running = await _taken(ledger.hold(CPU))
    _, large = _waiting(ledger, Resources.of(2))
    _, small = _waiting(ledger, CPU)
    await _settle()
    assert not small.done()

    large.cancel()
    await _settle()

    assert small.done() and ledger.free == Resources(0, 0, 0)
    running.free()
    (await small).free()
    assert ledger.free == Resources(2000, 0, 0)


async def test_a_request_the_host_can_never_hold_is_said_and_never_waited_for() -> None:
    ledger = Ledger(HostCapacity.of(2, 4096, ("0",)))

    assert ledger.why_never(Resources.of(2, 4096, 1)) is None
    assert ledger.why_never(Resources.of(4)) == (
        "it asks for 4 cpus, more than this host's whole capacity (2 cpus, 4096 MiB, gpus 0)"
    )
    assert ledger.why_never(Resources.of(1, 8192)) is not None
    assert ledger.why_never(Resources.of(1, 0, 2)) is not None
    assert ledger.why_never(Resources.of(1, 0, 1), ["3"]) == (
        "it was placed on gpu 3, and this host has gpus 0"
    )
    with pytest.raises(ValueError, match="4 cpus"):
        await ledger.hold(Resources.of(4)).take()
    assert ledger.fits(Resources.of(2))  # nothing was left waiting


async def test_devices_are_never_shared_placed_ones_waited_for_others_picked_in_order() -> None:
    ledger = Ledger(HostCapacity.of(8, 0, ("0", "1", "2")))
    placed = await _taken(ledger.hold(Resources.of(1, 0, 1), ["1"]))
    picked = await _taken(ledger.hold(Resources.of(1, 0, 2)))

    assert (placed.devices, picked.devices) == (("1",), ("0", "2"))
    assert not ledger.fits(Resources.of(1, 0, 1), ["1"])
    again = ledger.hold(Resources.of(1, 0, 1), ["1"])
    starting = asyncio.ensure_future(_taken(again))
    await _settle()
    assert not starting.done()

    placed.free()
    await _settle()
    assert again.devices == ("1",)
    assert ledger.free == Resources(6000, 0, 0)


def test_a_command_sees_its_own_devices_none_on_a_gpu_host_and_nothing_is_said_elsewhere() -> None:
    gpu_host = Ledger(HostCapacity.of(4, 0, ("0", "1")))
    with_gpu, without = gpu_host.hold(Resources.of(1, 0, 1), ["1"]), gpu_host.hold(CPU)
    with_gpu.devices, without.devices = ("1",), ()

    assert with_gpu.environment() == {"CUDA_VISIBLE_DEVICES": "1", "VIGIL_GPUS": "1"}
    assert without.environment() == {"CUDA_VISIBLE_DEVICES": ""}
    assert Ledger(HostCapacity.of(4, 0)).hold(CPU).environment() == {}


async def test_many_commands_in_a_random_order_never_over_commit_the_host() -> None:
    capacity = HostCapacity.of(3, 4096, ("0", "1"))
    ledger = Ledger(capacity)
    shapes = [QUARTER, CPU, Resources.of(2, 1024), Resources.of(0.5, 0, 1), Resources.of(1, 3000)]
    rng = random.Random(39)
    held: list[Resources] = []
    busy: list[str] = []
    worst = Resources()

    async def command(request: Resources) -> None:
        nonlocal worst
        hold = ledger.hold(request)
        await hold.take()
        assert hold.devices is not None
        held.append(request)
        busy.extend(hold.devices)
        total = sum(held, Resources())
        assert total.fits_in(capacity.resources) and len(busy) == len(set(busy))
        worst = Resources(*(max(a, b) for a, b in zip(_tuple(worst), _tuple(total), strict=True)))
        await asyncio.sleep(rng.random() / 1000)
        held.remove(request)
        for device in hold.devices:
            busy.remove(device)
        hold.free()

    await asyncio.gather(*(command(rng.choice(shapes)) for _ in range(300)))

    assert ledger.free == capacity.resources
    assert worst.millicpus > 2000  # it was busy, not run one at a time


def _tuple(amount: Resources) -> tuple[int, int, int]:
    return amount.millicpus, amount.memory_mb, amount.gpus


async def test_a_staged_command_waits_behind_those_placed_on_capacity_whenever_they_came() -> None:
    ledger = Ledger(HostCapacity.of(1, 1024))
    running = ledger.hold(CPU)
    await running.take()
    staged = ledger.hold(CPU, staged=True)
    staged_start = asyncio.ensure_future(_taken(staged))
    await _settle()
    placed, placed_start = _waiting(ledger, CPU)  # placed ahead of it, after it came
    await _settle()
    assert not ledger.fits(CPU, staged=True) and not ledger.fits(CPU)

    running.free()
    await _settle()
    assert placed_start.done() and not staged_start.done()

    placed.free()
    await _settle()
    assert staged_start.done()
    staged.free()
    assert ledger.fits(CPU, staged=True)


async def test_a_staged_command_that_fits_starts_at_once_when_nothing_waits() -> None:
    ledger = Ledger(HostCapacity.of(2, 1024))
    assert ledger.fits(CPU, staged=True)
    await ledger.hold(CPU, staged=True).take()
    assert ledger.free == Resources(1000, 1024, 0)


async def test_a_staged_command_leaves_room_for_placed_tasks_on_their_way_to_their_commands() -> (
    None
):
    ledger = Ledger(HostCapacity.of(1, 1024))
    ledger.expect("t-placed", CPU)  # its message came; it is being taken and set up
    assert ledger.fits(CPU) and not ledger.fits(CPU, staged=True)
    staged = ledger.hold(CPU, staged=True)
    staged_start = asyncio.ensure_future(_taken(staged))
    await _settle()
    assert not staged_start.done()

    ledger.unexpect("t-placed")  # given up before its command: what it was left goes on
    await _settle()
    assert staged_start.done()


async def test_a_placed_task_stops_being_expected_once_its_command_asks_for_its_hold() -> None:
    ledger = Ledger(HostCapacity.of(2, 1024))
    ledger.expect("t-placed", CPU)
    await ledger.hold(CPU, key="t-placed").take()
    assert ledger.fits(CPU, staged=True)  # the other CPU: nothing more is expected
