"""Taking work messages from the pool and host queues into a bounded intake of tasks.

Each message is handed to this worker's taker (`claims.Taker`: a delivery again of a claim
in hand is acked and dropped) and its task taken as a `tenure.Tenure`, which acks the message
once the task is durably this worker's (for a setup whose take is folded into the `on_cpu`
move, once that move committed) or found stale; the task then runs in a tracked asyncio
task. A task counts against the intake from its take to
its command's exit: what follows (post-processing, bookkeeping) overlaps the next tasks. Which
commands run at once is the runner's business (its ledger: each holds its request of the
host's capacity); the tasks taken beyond them are set up meanwhile, each waiting `queued` for
its request to be free. Messages beyond the intake stay unacked, so the broker hands them to
someone else if this worker dies.

Two bounds: the host queue carries what the scheduler placed on this host, already
bounded by its capacity (plus `prefetch`), so its intake only guards the worker against a
flood: `intake_bound`, room for tasks of a quarter CPU. The pool queue, whose work nobody
placed (the legacy path, and any work sent there during an upgrade), is taken as before the
shared pool: `slots + prefetch` tasks at once (`slots`: the host's CPUs rounded up), so that
one worker does not take and hold work that other hosts could run now.

Every `reconcile_s` the consumer compares what PostgreSQL says this worker instance holds
with what its handlings drive (`reconcile`): a task held but driven by none (the reply of its
take was lost after the take committed, so the take made again found it taken and did
nothing; or its driver failed and could not record why) is driven again from where it rests
when nothing after its take had started (`Tenure.resuming`), and failed as `lost` otherwise,
which the triage then recovers or resubmits.
"""

import asyncio
import functools
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from uuid import UUID

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from services.worker import cleanup
from services.worker.admission import Admission
from services.worker.stages import StageRunner
from services.worker.tenure import Tenure
from shared.domain.errors import InvalidMessage
from shared.domain.messages import RemoveWorkdirs, RunStage, decode
from shared.domain.scheduling.resources import Resources
from shared.domain.states import Stage
from shared.messaging.amqp import Broker, settle
from shared.messaging.topology import declare_all_work_queues
from shared.runtime.health import Check
from shared.runtime.lifecycle import wait_or_stop
from shared.runtime.ride_out import ride_out
from shared.store import tasks_repo

logger = logging.getLogger(__name__)


def intake_bound(slots: int, prefetch: int) -> int:
    """How many tasks the worker holds at once from its take to its command's exit: four a
    CPU (`slots`: the host's CPUs rounded up), at least 8, plus `prefetch`. Room for tasks of
    a quarter CPU each; what the scheduler sends a host is bounded by its capacity already,
    so this only keeps a flood (a scheduler gone wrong) from being taken all at once."""
    return max(8, 4 * slots) + prefetch


def _placed_request(message: RunStage) -> Resources | None:
    """What the command of a new task placed on this host's capacity will hold (its claim's
    `hold_*`, as the planning round wrote them); None for any other work (a staged task, a
    later stage, work nobody placed)."""
    claimed = message.claimed
    if message.stage is not Stage.SETUP or claimed is None or claimed.get("staged"):
        return None
    millicpus = claimed.get("hold_millicpus")
    if not isinstance(millicpus, int):
        return None
    memory_mb, gpus = claimed.get("hold_memory_mb"), claimed.get("hold_gpus")
    return Resources(
        millicpus,
        memory_mb if isinstance(memory_mb, int) else 0,
        gpus if isinstance(gpus, int) else 0,
    )


class Permit:
    """A place in the intake (and in the pool queue's, for its work), given back once (when
    the command exits, or at the end)."""

    def __init__(self, *semaphores: asyncio.Semaphore) -> None:
        self._semaphores = semaphores

    @classmethod
    async def acquire(cls, *semaphores: asyncio.Semaphore) -> "Permit":
        """Places in each of `semaphores`, in their order (always the pool's first: no two
        handlings wait for each other's)."""
        taken: list[asyncio.Semaphore] = []
        try:
            for semaphore in semaphores:
                await semaphore.acquire()
                taken.append(semaphore)
        except BaseException:
            cls(*taken).release()
            raise
        return cls(*taken)

    def release(self) -> None:
        semaphores, self._semaphores = self._semaphores, ()
        for semaphore in semaphores:
            semaphore.release()


class _Ack:
    """Acks its message, once."""

    def __init__(self, incoming: AbstractIncomingMessage) -> None:
        self._incoming = incoming
        self.done = False

    async def __call__(self) -> None:
        if not self.done:
            await settle(self._incoming, ack=True)
            self.done = True


class Consumer:
    """Consumes both queues of this host into a bounded set of running tasks."""

    def __init__(self, runner: StageRunner, slots: int, prefetch: int = 0) -> None:
        self._runner = runner
        self._prefetch = intake_bound(slots, prefetch)
        self._intake = asyncio.Semaphore(self._prefetch)
        #: The pool queue's own bound, within the intake (its work nobody placed).
        self._pool_prefetch = slots + prefetch
        self._pool_intake = asyncio.Semaphore(self._pool_prefetch)
        self._tasks: set[asyncio.Task[None]] = set()
        self._consuming: list[tuple[AbstractQueue, str]] = []
        #: The pool queue on a channel of `slots + prefetch`, and on one of a single
        #: delivery for probing (`Admission.PROBING`).
        self._pool_queue: AbstractQueue | None = None
        self._probe_queue: AbstractQueue | None = None
        #: A probing host's pool tasks hold this from their take to their end.
        self._probe = asyncio.Lock()
        self._stopping = False
        self._admission = Admission.SHUT
        self._reconciling: asyncio.Task[None] | None = None
        #: How many tasks PostgreSQL said this instance holds at the last heartbeat (None:
        #: not said yet); none held, the reconcile has nothing to read (`note_held`).
        self._held: int | None = None
        self._stopped = asyncio.Event()

    async def start(
        self, broker: Broker, host_id: str, pool_name: str, admission: Admission
    ) -> None:
        """Declare this host's queues and consume the host queue, and the pool queue as far as
        `admission` lets the host."""
        channel = await broker.channel_for_consuming(self._prefetch)
        pool_q, host_q, _ = await declare_all_work_queues(
            channel, broker.topology, host_id, pool_name
        )
        # passive declares: a robust channel restores its consumer after a broker restart
        pool_channel = await broker.channel_for_consuming(self._pool_prefetch)
        self._pool_queue = await pool_channel.get_queue(pool_q.name)
        probe_channel = await broker.channel_for_consuming(1)
        self._probe_queue = await probe_channel.get_queue(pool_q.name)
        self._consuming.append((host_q, await host_q.consume(self._on_message)))
        await self.admit(admission)
        logger.info("consuming %s", ", ".join(q.name for q, _ in self._consuming))
        self._reconciling = asyncio.create_task(
            self._reconcile_every(self._runner.settings.reconcile_s), name="reconcile"
        )

    async def admit(self, admission: Admission) -> None:
        """Consume the pool queue as the host's quarantine allows: fully when open, one task
        at a time while its breaker probes, not at all when shut (work for tasks whose work
        dirs are here still comes through the host queue)."""
        if admission == self._admission or self._stopping or self._pool_queue is None:
            return
        was, self._admission = self._admission, admission
        for queue, handler in (
            (self._pool_queue, self._on_pool_message),
            (self._probe_queue, self._on_probe_message),
        ):
            wanted = admission is (
                Admission.OPEN if queue is self._pool_queue else Admission.PROBING
            )
            consuming = [e for e in self._consuming if e[0] is queue]
            if consuming and not wanted:
                for entry in consuming:
                    self._consuming.remove(entry)
                    await entry[0].cancel(entry[1])
            elif wanted and not consuming and queue is not None:
                self._consuming.append((queue, await queue.consume(handler)))
        log = logger.info if admission is Admission.OPEN else logger.warning
        log("host admission %s -> %s (pool queue %s)", was, admission, self._pool_queue.name)

    async def _on_message(self, incoming: AbstractIncomingMessage) -> None:
        """A message of the host queue."""
        self._track(self._handle(incoming), f"work-{incoming.delivery_tag}")

    async def _on_pool_message(self, incoming: AbstractIncomingMessage) -> None:
        self._track(self._handle(incoming, pool=True), f"pool-{incoming.delivery_tag}")

    def _track(self, handling: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(handling, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_probe_message(self, incoming: AbstractIncomingMessage) -> None:
        self._track(self._probe_with(incoming), f"probe-{incoming.delivery_tag}")

    async def _probe_with(self, incoming: AbstractIncomingMessage) -> None:
        """A probing host runs one task of its pool at a time; one that waited while the
        breaker shut again goes back to the queue."""
        async with self._probe:
            if self._admission is Admission.SHUT:
                await settle(incoming, ack=False, requeue=True)
                return
            await self._handle(incoming, pool=True)

    async def _handle(self, incoming: AbstractIncomingMessage, pool: bool = False) -> None:
        """Handle one work message (`pool`: of the pool queue, within its own bound too)."""
        try:
            message = decode(incoming.body)
            if not isinstance(message, RemoveWorkdirs | RunStage):
                raise InvalidMessage(f"a worker cannot handle {message.type}")
        except InvalidMessage as exc:
            logger.error("dead-lettering a bad work message: %s", exc)
            await settle(incoming, ack=False, requeue=False)
            return
        if isinstance(message, RunStage):
            await self._run(incoming, message, pool)
            return
        try:  # takes no place in the intake: it runs no task
            await cleanup.remove_workdirs(Path(self._runner.settings.work_root), message)
        except Exception:
            logger.exception("work message failed")
            await settle(incoming, ack=False, requeue=True)
        else:
            await settle(incoming, ack=True)

    async def _run(self, incoming: AbstractIncomingMessage, message: RunStage, pool: bool) -> None:
        """Hand the message to this worker's taker, which takes its task (`Tenure.taking`,
        once it is the only delivery of its claim in hand) and acks it once the task is
        durably this worker's (or the message is stale); drive the task, within the intake
        (and the pool queue's bound, for its work)."""
        ack = _Ack(incoming)
        taker = self._runner.taker
        if not await taker.received(message, ack):
            return
        try:  # before anything waits: the ledger learns of placed tasks in delivery order
            with self._runner.ledger.expecting(message.task_id, _placed_request(message)):
                await self._run_delivered(incoming, message, pool, ack)
        finally:
            taker.let_go(message.task_id, message.claim)

    async def _run_delivered(
        self, incoming: AbstractIncomingMessage, message: RunStage, pool: bool, ack: "_Ack"
    ) -> None:
        try:
            bounds = (self._pool_intake, self._intake) if pool else (self._intake,)
            permit = await Permit.acquire(*bounds)
            try:
                if self._stopping:  # received before intake stopped, not started: give it back
                    await settle(incoming, ack=False, requeue=True)
                    return
                held = await self._take(message, ack)
                if held is not None:
                    await self._runner.drive(held, permit)
            finally:
                permit.release()
            await ack()  # its tenure acked it at its take (or found it stale): else now
        except InvalidMessage as exc:
            logger.error("dead-lettering a bad work message: %s", exc)
            if not ack.done:
                await settle(incoming, ack=False, requeue=False)
        except asyncio.CancelledError:
            if not ack.done:
                await settle(incoming, ack=False, requeue=True)
            raise
        except Exception:
            logger.exception("work message failed")
            if not ack.done:  # back to the queue; the delivery limit stops a poison message
                await settle(incoming, ack=False, requeue=True)

    async def _take(self, message: RunStage, ack: "_Ack") -> Tenure | None:
        """`take`, waiting for a database that went away (a restart) rather than handing the
        message back at once: its redelivery would fail the same way within milliseconds, and
        each one spends the message's delivery limit, after which it is dead-lettered and its
        task stays claimed with no message. A take is safe to make again (it reads, then moves
        under the message's claim)."""
        take = functools.partial(self._runner.take, message, ack)
        return await ride_out(take, f"taking task {message.task_id}")

    async def _reconcile_every(self, every_s: float) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception as exc:  # the database away, most likely: the next round
                logger.warning("reconcile failed, will retry: %s", exc)
            if await wait_or_stop(self._stopped, every_s):
                return

    def note_held(self, held: int) -> None:
        """How many tasks the heartbeat read that this instance holds."""
        self._held = held

    async def reconcile(self) -> int:
        """One comparison of what PostgreSQL says this worker instance holds with what its
        handlings drive; each task held but driven by none is driven again (or failed as lost,
        `_drive_again`) in a tracked task of its own. Returns how many were found. Reads
        nothing when the last heartbeat said this instance holds no task (an idle host's
        reconcile costs the database nothing); a task taken since is compared at
        the round after the next beat."""
        if self._held == 0:
            return 0
        runner = self._runner
        async with runner.pool.acquire() as conn:
            held = await tasks_repo.held_by(conn, runner.instance)
        found = 0
        for task in held:
            claim = task.claim
            # in hand from here on: a delivery of its claim is acked and dropped meanwhile
            if claim is None or self._stopping or not runner.taker.hand(task.id, claim):
                continue
            found += 1
            driving = asyncio.create_task(self._drive_again(task, claim), name=f"resume-{task.id}")
            self._tasks.add(driving)
            driving.add_done_callback(self._tasks.discard)
        return found

    async def _drive_again(self, task: tasks_repo.Task, claim: UUID) -> None:
        """Drive a held task that no handling drives from where it rests, within the intake;
        fail it as lost at once when that is not safe (a command may have run)."""
        taker = self._runner.taker
        try:
            held = await Tenure.resuming(taker, task.id, task.job_id, claim)
            if held is None:  # not ours any more (then this is a no-op), or not safe to resume
                why = (
                    f"its worker {self._runner.instance} held it {task.state} but drove it no"
                    " more (a take whose reply was lost, or a driver that failed without"
                    " recording why): not run again from there"
                )
                if await taker.lose(task.id, claim, why):
                    logger.warning("task %s: held but driven by none: lost", task.id)
                return
            logger.warning(
                "task %s: held but driven by none (its take's reply lost?): driving it again"
                " from %s",
                task.id,
                held.state,
                extra={"task_id": task.id},
            )
            permit = await Permit.acquire(self._intake)
            try:
                if not self._stopping:  # else its worker goes: the supervisor reaps its tasks
                    await self._runner.drive(held, permit)
            finally:
                permit.release()
        except Exception:
            logger.exception("task %s: could not drive it again", task.id)
        finally:
            taker.let_go(task.id, claim)

    async def stop_intake(self) -> None:
        """Stop receiving new messages; those running go on, those waiting for a place go back."""
        self._stopping = True
        self._stopped.set()
        if self._reconciling is not None:
            self._reconciling.cancel()
            await asyncio.gather(self._reconciling, return_exceptions=True)
        for queue, tag in self._consuming:
            try:
                await queue.cancel(tag)
            except Exception as exc:  # a dead channel has no consumer left to cancel
                logger.warning("could not cancel consumer on %s: %s", queue.name, exc)
        self._consuming.clear()

    async def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for running tasks, then cancel the rest; returns how many."""
        if not self._tasks:
            return 0
        _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def intake(self) -> Check:
        """What this worker takes now, for its health: a fact, never a fault (a quarantined or
        draining host, a worker stopping, are as they should be)."""
        held = f"{self.in_flight} task(s) in hand"
        if self._stopping:
            return Check(False, f"intake stopped: draining, {held}", "none")
        if self._admission is Admission.OPEN:
            return Check(True, f"taking work from the pool queue, {held}")
        if self._admission is Admission.PROBING:
            return Check(False, f"host quarantined, probing: one task at a time, {held}", "none")
        return Check(False, f"host quarantined or draining: its own queue only, {held}", "none")
