"""A host's queues live as long as the host.

Each host has two durable quorum queues (its work queue and its supervisor's), each a Raft
group on every broker node. A pilot is a new host id each time, so without this every ended
pilot would leave two behind for ever. The leading scheduler deletes them once the host is
retired and nothing in them is owed:

- the host is gone for good: a pilot's whose allocation the batch system reports ended (its
  processes ended with it), or one an operator removed (`shared/operations/host_removal.py`;
  its running worker stops at its next beat). A host silent for any other reason may be cut
  off and come back with the same worker process, which declares its queues only at its
  start: its queues stay;
- the host is dead: no worker registered (the reaper declared its held tasks lost, or it
  stopped), and neither its worker nor its supervisor has beaten for `dead_after_s`;
- no task still claims it: held tasks were resolved by the reaper, and new tasks placed on it
  and not taken were placed again (`plan_repo.give_back_from_gone_hosts`).

What is left in the queues is then only messages of tasks the database already resolved. The
host's row is locked while its queues go, so a worker registering under the same id waits and
declares them again at its start. A work message for the host that the relay reads later is
dropped, never published (that would declare the queue again): its task is the database's
(`Relay`, `is_retired`).
"""

import logging
from collections.abc import Callable
from typing import Final

from shared.messaging.amqp import Broker
from shared.messaging.topology import delete_host_queues
from shared.store import hosts_repo
from shared.store.db import Connection, Pool

logger = logging.getLogger(__name__)

#: Hosts retired per look at most (each costs two queue deletes on the broker).
BATCH: Final = 50


async def is_retired(conn: Connection, host_id: str) -> bool:
    """Whether `host_id`'s queues are deleted and it has not come back."""
    return await hosts_repo.queues_retired(conn, host_id)


class HostQueues:
    """Deletes the queues of retired hosts (`run_once`), telling `on_deleted` of each."""

    def __init__(
        self,
        pool: Pool,
        broker: Broker,
        dead_after_s: float,
        on_deleted: Callable[[str], None] | None = None,
    ) -> None:
        self._pool, self._broker, self._dead_after_s = pool, broker, dead_after_s
        self._on_deleted = on_deleted

    async def run_once(self) -> int:
        """Retire the hosts due (up to `BATCH`); how many."""
        async with self._pool.acquire() as conn, conn.transaction():
            due = await hosts_repo.lock_queues_due(conn, self._dead_after_s, BATCH)
            for host_id in due:
                await self._retire(conn, host_id)
        return len(due)

    async def _retire(self, conn: Connection, host_id: str) -> None:
        await delete_host_queues(self._broker.channel, self._broker.topology, host_id)
        await hosts_repo.mark_queues_deleted(conn, host_id)
        if self._on_deleted is not None:
            self._on_deleted(host_id)
