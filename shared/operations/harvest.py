"""Cleaning up after jobs: removing work dirs on their hosts, purging a job, and
finding the jobs whose retention ran out.

Work dirs live on the host that ran the task, so they are removed by that host's worker: a
`RemoveWorkdirs` per (host, job) goes to the host queue through the outbox, in the caller's
transaction, and the worker deletes only what lies inside its own work root. Outputs are in
the object store, under the job's prefix, which a purge deletes.
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from shared.domain import purge_rules
from shared.domain.errors import Conflict, NotFound
from shared.domain.messages import JobEvent, JobOutcome, RemoveWorkdirs
from shared.domain.purge_rules import PURGEABLE
from shared.domain.states import IN_FLIGHT, JobState
from shared.messaging.topology import host_key
from shared.objects import ObjectStore, keys
from shared.store import bundle_repo, jobs_repo, logs_repo, outbox, outputs_repo, quota_repo
from shared.store.db import Connection
from shared.store.tasks_repo import Task


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


#: Tasks of job `j` that a purge must wait for: in flight, holding a claim, or a failure the
#: triage has not decided about. `$2` is the in-flight states.
_BUSY = (
    "t.job_id = j.id AND (t.state = ANY($2::task_state[]) OR t.claim IS NOT NULL OR NOT t.decided)"
)
#: Jobs chained from job `j` that have not ended.
_DOWNSTREAM = "d.inputs_from = j.id AND d.state <> ALL($3::job_state[])"


def _in_flight() -> list[str]:
    return sorted(s.value for s in IN_FLIGHT)


def _ended() -> list[str]:
    return sorted(s.value for s in PURGEABLE)


@dataclass(frozen=True)
class Purged:
    """What a purge removed."""

    job_id: str
    logs: int
    contents: int
    removals: int
    #: Objects deleted from the object store (its outputs).
    objects: int = 0


#: Log lines one purge statement deletes, and tasks whose outputs and work dirs one short
#: transaction handles: no statement of a purge runs long, whatever the job's size.
PURGE_LOG_BATCH = 5000
PURGE_TASK_BATCH = 500


async def purge_job(
    conn: Connection, job_id: str, actor: str, reason: str, store: ObjectStore | None = None
) -> Purged:
    """Purge an ended job: mark it purged (`mark_purged`, one short transaction), then clear
    its data in batches (`clear_purged`). Call it outside a transaction."""
    await mark_purged(conn, job_id, actor, reason)
    return await clear_purged(conn, job_id, store)


async def mark_purged(conn: Connection, job_id: str, actor: str, reason: str) -> None:
    """Record who purged the job and why, and publish `job.purged.<job>`, in the caller's
    transaction (or one of its own): from then on nothing may bring the job back to work, and
    its data is to be cleared (`clear_purged`; the scheduler finishes a clearing cut short).

    Its stored outputs stop counting against its owner's quota now (`quota_repo`).

    The job row is locked first (like every writer that adds work to a job). Raises `NotFound`
    for no such job and `Conflict` when `purge_rules.refusal` says no (naming what runs).
    """
    async with conn.transaction():
        facts = await _facts(conn, job_id)
        refused = purge_rules.refusal(facts)
        if refused is not None:
            raise Conflict.of(refused)
        await jobs_repo.mark_purged(conn, job_id, actor, reason)
        await quota_repo.give_back_job(conn, job_id)  # its outputs leave the owner's quota
        event = JobEvent(
            job_id=job_id, outcome=JobOutcome.PURGED, brief=f"purged by {actor}: {reason}"
        )
        await outbox.add_job_event(conn, event)


async def clear_purged(conn: Connection, job_id: str, store: ObjectStore | None = None) -> Purged:
    """Clear the data of a job marked purged, in batches, each statement (or short
    transaction) on its own so that no lock is held long: delete its log lines and the bytes
    of its files, drop the kept bytes of its outputs (their records stay), queue the removal
    of its work dirs on their hosts, delete its outputs from `store` (every object under the
    job's prefix, a failed attempt's too); then record that the purge is done
    (`purge_done_at`). Idempotent: a clearing cut short (a store that failed:
    `ObjectStoreError`) is done again from the start by the next call. Call it outside a
    transaction."""
    logs = 0
    after = 0
    while True:
        gone = await logs_repo.delete_batch_of_job(conn, job_id, after, PURGE_LOG_BATCH)
        logs += len(gone)
        if len(gone) < PURGE_LOG_BATCH:
            break
        after = max(gone)
    await bundle_repo.delete(conn, job_id)  # the bytes of its files (their list stays)
    contents = removals = 0
    index: int | None = None
    task_id = ""
    while True:
        async with conn.transaction():
            # by (index, id): the tasks of an input's lineage share its index
            rows = await conn.fetch(
                "SELECT * FROM tasks WHERE job_id = $1"
                " AND (index, id) > (coalesce($2, -2147483648), $3) ORDER BY index, id LIMIT $4",
                job_id,
                index,
                task_id,
                PURGE_TASK_BATCH,
            )
            if not rows:
                break
            tasks = [Task.from_record(r) for r in rows]
            contents += _count(await outputs_repo.drop_contents(conn, [t.id for t in tasks]))
            removals += await remove_workdirs(conn, tasks, reason=f"job {job_id} purged")
        index, task_id = tasks[-1].index, tasks[-1].id
    objects = await _delete_objects(store, job_id) if store is not None else 0
    await jobs_repo.mark_purge_done(conn, job_id)
    return Purged(job_id, logs, contents, removals, objects)


async def _delete_objects(store: ObjectStore, job_id: str) -> int:
    """Delete every object of the job from the store; how many there were."""
    found = [info.key for info in await store.list_prefix(keys.job_outputs(job_id))]
    await store.delete(found)
    return len(found)


async def unfinished_purges(conn: Connection, older_than_s: float, limit: int) -> list[str]:
    """Jobs marked purged more than `older_than_s` ago whose clearing has not finished (the
    purger stopped half-way), oldest first."""
    rows = await conn.fetch(
        "SELECT id FROM jobs WHERE purged_at IS NOT NULL AND purge_done_at IS NULL"
        " AND purged_at < now() - make_interval(secs => $1) ORDER BY purged_at LIMIT $2",
        older_than_s,
        limit,
    )
    return [r["id"] for r in rows]


async def _facts(conn: Connection, job_id: str) -> purge_rules.JobFacts:
    job = await jobs_repo.lock_for_purge(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    busy = await conn.fetch(
        f"SELECT t.id, t.state::text AS state FROM tasks t, jobs j WHERE j.id = $1 AND {_BUSY}"
        " ORDER BY t.index LIMIT $3",
        job_id,
        _in_flight(),
        purge_rules.NAMED + 1,
    )
    downstream = await conn.fetch(
        f"SELECT d.id FROM jobs d, jobs j WHERE j.id = $1 AND {_DOWNSTREAM}"
        " ORDER BY d.created_at LIMIT $2",
        job_id,
        purge_rules.NAMED + 1,
        _ended(),
    )
    return purge_rules.JobFacts(
        job_id=job_id,
        state=JobState(job["state"]),
        purged_at=job["purged_at"],
        purged_by=job["purged_by"],
        busy=[(r["id"], r["state"]) for r in busy],
        downstream=[r["id"] for r in downstream],
    )


def _count(status: str) -> int:
    return int(status.split()[-1])


async def check_not_purged(
    conn: Connection, job_id: str, doing: str, *, share_lock: bool = False
) -> None:
    """Raise `Conflict` (`job X was purged at T by U: cannot <doing>`) for a purged job: its
    data is gone, so nothing may bring it back to work. With `share_lock` the row stays
    share-locked until the transaction ends, so that no purge can start meanwhile."""
    row = await jobs_repo.purge_mark(conn, job_id, share_lock=share_lock)
    if row is not None and row["purged_at"] is not None:
        message = purge_rules.purged_message(job_id, row["purged_at"], row["purged_by"])
        raise Conflict(
            f"{message}: cannot {doing}",
            next_step="its data is gone for good; submit a new job to run its inputs again",
        )


async def set_retention(conn: Connection, job_id: str, retention_s: float | None) -> None:
    """Keep the job's data `retention_s` seconds after it ends (None: forever)."""
    await jobs_repo.set_retention(conn, job_id, retention_s)


async def due_for_retention(conn: Connection, limit: int) -> list[tuple[str, float]]:
    """(job id, retention) of ended, unpurged jobs whose retention has run out and that may be
    purged now (nothing busy, no unended job chained from them), longest ended first."""
    rows = await conn.fetch(
        "SELECT j.id, j.retention_s FROM jobs j WHERE j.retention_s IS NOT NULL"
        " AND j.purged_at IS NULL AND j.finished_at IS NOT NULL"
        " AND j.finished_at < now() - make_interval(secs => j.retention_s)"
        " AND j.state = ANY($3::job_state[])"
        f" AND NOT EXISTS (SELECT 1 FROM tasks t WHERE {_BUSY})"
        f" AND NOT EXISTS (SELECT 1 FROM jobs d WHERE {_DOWNSTREAM})"
        " ORDER BY j.finished_at LIMIT $1",
        limit,
        _in_flight(),
        _ended(),
    )
    return [(r["id"], float(r["retention_s"])) for r in rows]
