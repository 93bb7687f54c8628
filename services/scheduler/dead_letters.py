"""Work messages the broker gave up on: their delivery limit spent (a worker or a supervisor
failed on each delivery), they come to the dead-letter queue, which every scheduler reads.

A dead-lettered `RunStage` whose task is still claimed by it and taken by no worker would
leave that task claimed for ever, with no message to run it: the scheduler gives the claim
back (the task is released again, with a new message), and after `MAX_DEAD_LETTERS` such
deaths of one task it holds a new task instead (`on_hold`, its brief saying why) and fails one
further on as `platform`, so that a message no worker can take does not loop. Every dead
letter is kept with its job as a `job_errors` row of severity `dead_letter` (what
`vigil_dead_letters` counts), whatever its type, so that an operator knows. A dead `KillTask`
needs nothing more: the kill it carried is owed by its attempt (closed, not reaped), which the
supervisor of its host does at its next reconcile all the same
(`services/supervisor/owed_kills.py`); a host whose supervisor cannot be reached at all is
the reaper's and the fence's.
"""

import json
import logging
from typing import Final

from aio_pika.abc import AbstractIncomingMessage

from shared.domain.errors import InvalidMessage, StaleState
from shared.domain.messages import KillTask, Message, RemoveWorkdirs, RunStage, decode
from shared.domain.outcomes import Outcome
from shared.domain.states import FailureClass, TaskState, failure_state_for
from shared.messaging.amqp import Broker, settle
from shared.operations import loss
from shared.runtime.ride_out import ride_out
from shared.store import job_errors_repo, tasks_repo
from shared.store.db import Connection, Pool

logger = logging.getLogger(__name__)

#: Dead letters of one task's work after which it is held rather than released again.
MAX_DEAD_LETTERS: Final = 3
SEVERITY: Final = "dead_letter"


async def start(broker: Broker, pool: Pool) -> None:
    """Consume the dead-letter queue (declared with the exchanges) for as long as the broker
    connection lives."""
    channel = await broker.channel_for_consuming(16)
    # a passive declare: a robust channel restores its consumer after a broker restart
    queue = await channel.get_queue(broker.topology.dead_letter_queue)

    async def on_message(incoming: AbstractIncomingMessage) -> None:
        try:
            message = decode(incoming.body)
        except InvalidMessage as exc:
            logger.error("dropping an undecodable dead letter: %s", exc)
            await settle(incoming, ack=True)
            return
        await ride_out(lambda: handle(pool, message), "recording a dead letter")
        await settle(incoming, ack=True)

    await queue.consume(on_message)


async def handle(pool: Pool, message: Message) -> None:
    """Record one dead letter and, for a `RunStage` whose task it still claims, release or
    hold that task (idempotent: the claim is compared and set)."""
    task_ids = _task_ids(message)
    if not task_ids:
        logger.error("a dead letter names no task: %s", message.type)
        return
    async with pool.acquire() as conn, conn.transaction():
        deaths = 1 + await _deaths(conn, task_ids[0])
        what = f"its {message.type} message was dead-lettered ({deaths} time(s))"
        if isinstance(message, RunStage):
            what += f": no worker could take it; {await _settle_task(conn, message, deaths)}"
        elif isinstance(message, KillTask):
            what += (
                ": the supervisor of its host kills what is left of the command at its next"
                " reconcile all the same (a kill owed: its attempt is not recorded reaped)"
            )
        else:
            what += ": see the services' logs"
        await job_errors_repo.record(
            conn,
            getattr(message, "job_id", None),
            task_ids[0],
            SEVERITY,
            what,
            json.dumps(message.model_dump(mode="json")),
        )
    logger.error("task %s: %s", task_ids[0], what)


async def _settle_task(conn: Connection, message: RunStage, deaths: int) -> str:
    task = await tasks_repo.get(conn, message.task_id)
    if task is None or task.claim != message.claim or task.worker is not None:
        return "the task has moved on since (nothing to do)"
    if deaths < MAX_DEAD_LETTERS:
        if await tasks_repo.unclaim_untaken(conn, task.id, message.claim):
            return "released again"
        return "the task has moved on since (nothing to do)"
    brief = f"its work message was dead-lettered {deaths} times: no worker could take it"
    if task.state is TaskState.NEW:  # not yet any worker's: held for an operator to look
        try:
            await tasks_repo.transition(
                conn,
                task.id,
                TaskState.ON_HOLD,
                among=frozenset({TaskState.NEW}),
                claim=message.claim,
                changes={"claim": None, "error_brief": f"held: {brief}"},
            )
        except StaleState:
            return "the task has moved on since (nothing to do)"
        return "held (release it once the workers' logs say why)"
    outcome = Outcome(failure_state_for(task.state), FailureClass.PLATFORM, brief=brief)
    if await loss.declare(conn, task, outcome):
        return "failed as platform"
    return "the task has moved on since (nothing to do)"


async def _deaths(conn: Connection, task_id: str) -> int:
    count = await conn.fetchval(
        "SELECT count(*) FROM job_errors WHERE task_id = $1 AND severity = $2", task_id, SEVERITY
    )
    return int(count)


def _task_ids(message: Message) -> list[str]:
    if isinstance(message, RemoveWorkdirs):
        return list(message.task_ids)
    task_id = getattr(message, "task_id", None)
    return [task_id] if isinstance(task_id, str) else []
