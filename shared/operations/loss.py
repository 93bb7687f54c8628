"""Declaring a task lost: its worker, host or process is gone while the task was held."""

import logging
import time
from collections.abc import Iterable

from shared.domain.errors import StaleState
from shared.domain.outcomes import Outcome, lost_outcome
from shared.domain.states import TaskState
from shared.store import attempts_repo, tasks_repo
from shared.store.db import Connection

logger = logging.getLogger(__name__)


async def declare(
    conn: Connection,
    task: tasks_repo.Task,
    outcome: Outcome | None = None,
    why: str = "",
    *,
    reaped: bool = False,
    since: float | None = None,
) -> bool:
    """Fail `task` as it was read (state and claim), closing its open attempts.

    `outcome` defaults to `lost` for the task's state; `reaped` says its process is known
    gone (or about to be killed by the caller); `since` is when (epoch seconds) the failure
    happened, if known, for the detection latency. Returns False when the task moved meanwhile
    (its worker reported first, or someone else declared it): a no-op.
    """
    outcome = outcome or lost_outcome(task.state, why)
    async with conn.transaction():
        try:
            await tasks_repo.transition(
                conn,
                task.id,
                outcome.state,
                among=frozenset({TaskState(task.state)}),
                claim=task.claim if task.claim is not None else tasks_repo.UNCLAIMED,
                changes=outcome.changes() | {"claim": None, "worker": None},
                job_event=outcome.job_event(task.job_id, task.id),
            )
        except StaleState:
            return False
        assert outcome.failure_class is not None
        await attempts_repo.close_open(
            conn,
            task.id,
            outcome.state.value,
            outcome.failure_class,
            outcome.brief or why,
            reaped=reaped,
            detected_after_s=max(0.0, time.time() - since) if since is not None else None,
        )
    logger.warning(
        "task %s declared %s: %s",
        task.id,
        outcome.failure_class.value,
        outcome.brief,
        extra={"job_id": task.job_id, "task_id": task.id},
    )
    return True


async def declare_all(conn: Connection, tasks: Iterable[tasks_repo.Task], why: str) -> int:
    """Declare each of `tasks` lost for `why` (a host gone: dead, or removed by an operator);
    how many were (those that moved meanwhile are not)."""
    lost = 0
    for task in tasks:
        lost += await declare(conn, task, why=why)
    return lost
