"""Cleaning up after jobs (issue 6): removing work dirs on their hosts, and purging a job.

Work dirs live on the host that ran the task, so they are removed by that host's worker: a
`RemoveWorkdirs` per (host, job) goes to the host queue through the outbox, in the caller's
transaction, and the worker deletes only what lies inside its own work root.
"""

from collections import defaultdict
from collections.abc import Sequence

from shared import outbox
from shared.db import Connection
from shared.messages import RemoveWorkdirs
from shared.tasks_repo import Task
from shared.topology import host_key


async def remove_workdirs(conn: Connection, tasks: Sequence[Task], reason: str = "") -> int:
    """Queue the removal of the work dirs of `tasks` on their hosts (in the caller's
    transaction): one `RemoveWorkdirs` per host and job. Tasks that never had a host or a
    work dir are skipped. Returns how many messages were queued."""
    groups: dict[tuple[str, str], list[Task]] = defaultdict(list)
    for task in tasks:
        if task.host is not None and task.workdir is not None:
            groups[(task.host, task.job_id)].append(task)
    for (host, job_id), found in sorted(groups.items()):
        message = RemoveWorkdirs(
            job_id=job_id,
            task_ids=[t.id for t in found],
            workdirs=[t.workdir for t in found if t.workdir is not None],
            reason=reason,
        )
        await outbox.add_work(conn, host_key(host), message)
    return len(groups)
