"""The worker's consumer: a work message delivered again while this worker handles it (its
ack was lost with a channel) never starts a second run of its task."""

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from services.worker.claims import Ack, Taker
from services.worker.consumer import Consumer, intake_bound
from services.worker.ledger import Ledger
from shared.domain.messages import RunStage, encode
from shared.domain.scheduling.resources import Resources
from shared.domain.states import Stage
from shared.host.capacity import HostCapacity


class _Incoming:
    def __init__(self, message: RunStage, tag: int) -> None:
        self.body, self.delivery_tag = encode(message), tag
        self.acked, self.rejects = asyncio.Event(), 0

    async def ack(self) -> None:
        self.acked.set()

    async def reject(self, requeue: bool = False) -> None:
        self.rejects += 1


class _Runner:
    settings = SimpleNamespace(work_root="/nonexistent")

    def __init__(self) -> None:
        self.takes: asyncio.Queue[str] = asyncio.Queue()
        self.go = asyncio.Event()
        self.ledger = Ledger(HostCapacity.of(1, 1024))
        self.taker = Taker(cast(Any, None), "w-1", "h-1", Path("/nonexistent"), cast(Any, None))

    async def take(self, message: RunStage, ack: Ack) -> object:
        self.takes.put_nowait(message.task_id)
        await ack()  # durably taken: acked at once
        return SimpleNamespace()

    async def drive(self, held: object, intake: Any) -> None:
        await self.go.wait()


async def _delivered(consumer: Consumer, incoming: _Incoming) -> None:
    await consumer._on_message(cast(Any, incoming))
    async with asyncio.timeout(5):
        await incoming.acked.wait()


async def test_a_message_delivered_again_while_it_is_handled_is_acked_not_run_twice() -> None:
    runner = _Runner()
    consumer = Consumer(cast(Any, runner), slots=4)
    message = RunStage(job_id="j-1", task_id="t-1", stage=Stage.SETUP, claim=uuid.uuid4())

    await _delivered(consumer, _Incoming(message, 1))  # taken (acked), now being driven
    again = _Incoming(message, 2)
    await _delivered(consumer, again)  # the same claim again: acked, not taken

    assert runner.takes.qsize() == 1 and again.rejects == 0

    # once the first handling is over, a new delivery of that claim is handled again (a stale
    # no-op for the real take), and another claim of the task is never held back
    runner.go.set()
    async with asyncio.timeout(5):
        while consumer.in_flight:  # noqa: ASYNC110  (the consumer has no event for it)
            await asyncio.sleep(0.01)
    other = RunStage(job_id="j-1", task_id="t-1", stage=Stage.CLUSTER, claim=uuid.uuid4())
    await _delivered(consumer, _Incoming(message, 3))
    await _delivered(consumer, _Incoming(other, 4))
    assert runner.takes.qsize() == 3


class _FoldingRunner(_Runner):
    """Takes without writing (a folded take) and makes it durable when told to."""

    def __init__(self, durable: bool) -> None:
        super().__init__()
        self.durable = durable

    async def take(self, message: RunStage, ack: Ack) -> object:
        self.takes.put_nowait(message.task_id)
        return SimpleNamespace(ack=ack)

    async def drive(self, held: Any, intake: Any) -> None:
        await self.go.wait()
        if self.durable:
            await held.ack()


async def test_a_folded_take_is_acked_only_once_it_is_durable() -> None:
    runner = _FoldingRunner(durable=True)
    consumer = Consumer(cast(Any, runner), slots=1)
    incoming = _Incoming(
        RunStage(job_id="j-1", task_id="t-1", stage=Stage.SETUP, claim=uuid.uuid4()), 1
    )

    await consumer._on_message(cast(Any, incoming))
    async with asyncio.timeout(5):
        await runner.takes.get()
    assert not incoming.acked.is_set()  # taken, not yet durably: a dead worker's goes back

    runner.go.set()
    async with asyncio.timeout(5):
        await incoming.acked.wait()
    assert incoming.rejects == 0


async def test_a_folded_take_that_found_its_task_gone_is_acked_as_stale() -> None:
    runner = _FoldingRunner(durable=False)
    runner.go.set()
    consumer = Consumer(cast(Any, runner), slots=1)
    incoming = _Incoming(
        RunStage(job_id="j-1", task_id="t-1", stage=Stage.SETUP, claim=uuid.uuid4()), 1
    )

    await _delivered(consumer, incoming)

    assert incoming.rejects == 0


async def test_host_queue_work_is_taken_up_to_the_intake_and_pool_work_up_to_slots() -> None:
    # the scheduler bounds what it places on a host by its capacity (tasks of a quarter CPU:
    # four a CPU); what comes through the pool queue nobody placed: one task a CPU, as before
    runner = _Runner()
    consumer = Consumer(cast(Any, runner), slots=2, prefetch=1)
    assert intake_bound(2, 1) == 9 and intake_bound(4, 0) == 16

    def message(n: int) -> _Incoming:
        run = RunStage(job_id="j-1", task_id=f"t-{n}", stage=Stage.SETUP, claim=uuid.uuid4())
        return _Incoming(run, n)

    for n in range(5):
        await consumer._on_pool_message(cast(Any, message(n)))
    await asyncio.sleep(0.05)
    assert runner.takes.qsize() == 3  # slots + prefetch
    for n in range(5, 15):
        await consumer._on_message(cast(Any, message(n)))
    await asyncio.sleep(0.05)
    assert runner.takes.qsize() == 9  # the intake: host work fills what pool work left

    runner.go.set()
    async with asyncio.timeout(5):
        while runner.takes.qsize() < 15:  # noqa: ASYNC110  (the consumer has no event for it)
            await asyncio.sleep(0.01)


async def test_a_task_placed_on_capacity_is_expected_from_its_delivery_until_it_is_done() -> None:
    """Staged commands leave room for a placed task from the moment its message comes, not
    only once its command asks for its hold (after its take and setup)."""
    runner = _Runner()
    consumer = Consumer(cast(Any, runner), slots=1)
    cpu = Resources.of(1)
    claimed = {"staged": False, "hold_millicpus": 1000, "hold_memory_mb": 0, "hold_gpus": 0}
    placed = RunStage(
        job_id="j-1", task_id="t-1", stage=Stage.SETUP, claim=uuid.uuid4(), claimed=claimed
    )
    staged = RunStage(
        job_id="j-1",
        task_id="t-2",
        stage=Stage.SETUP,
        claim=uuid.uuid4(),
        claimed=claimed | {"staged": True},
    )

    await _delivered(consumer, _Incoming(staged, 1))
    assert runner.ledger.fits(cpu, staged=True)  # a staged task expects nothing
    await _delivered(consumer, _Incoming(placed, 2))  # being driven, its hold not asked for

    assert not runner.ledger.fits(cpu, staged=True) and runner.ledger.fits(cpu)
    runner.go.set()
    assert await consumer.drain(5) == 0  # both handlings over, none cancelled
    assert runner.ledger.fits(cpu, staged=True)
