"""Pilots on a batch system: the leading scheduler is the only part of Vigil that
talks to it. Every `EVERY_S` it:

1. submits the pilots operators asked for (`requested`), as batch jobs running
   `python -m services.pilot`;
2. follows each submitted pilot's batch state: `pending` with the batch system's reason,
   `running`, or `ended` (a job the batch system no longer lists has ended);
3. cancels the batch jobs of `draining` pilots (withdrawn by an operator, or idle);
4. with `VIGIL_PILOTS_BACKEND` set, asks for pilots when work waits that no host can take
   (the planner's `no_host`, `resources`, `too_large`, of jobs still active), enough for the
   CPUs it needs, up to `VIGIL_PILOTS_MAX` alive, and withdraws those it asked for that have
   not started when that work no longer needs them (a job cancelled or finished);
5. withdraws a running pilot whose host has held no task for `VIGIL_PILOTS_IDLE_S` while no
   work waits for a host.

A pilot that ends, whatever ends it, is a host whose heartbeats stop: the reaper declares its
tasks lost and the triage resubmits them; new tasks placed on it and not taken are placed
again (`plan_repo.give_back_from_gone_hosts`).
"""

import logging
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, Protocol

from services.pilot.settings import PilotMargins
from shared.batch.slurm import BatchError, BatchJob
from shared.domain import pilots
from shared.host import private_dir
from shared.objects import STORE_CREDENTIALS
from shared.store import pilots_repo, pool_repo
from shared.store.db import Pool
from shared.store.pilots_repo import Pilot

logger = logging.getLogger(__name__)

#: How often the pool looks (seconds).
EVERY_S: Final = 2.0

#: The reasons of jobs that wait for a host the pool does not have.
WANTING_HOSTS: Final = ("no_host", "resources", "too_large")

#: Per job waiting for a host that a pilot could hold ($2 millicpus, $3 MiB, no GPU: a
#: pilot asked for is no use to the others, and would be kept up by them for nothing): its
#: request and how many of its tasks wait (counted up to 1,000: enough to size what to ask
#: for). A job waiting for a host that lasts (`host_ends`) counts when a new pilot would
#: last long enough: its tasks run for at most $4 seconds (one not restartable and of
#: unknown length never does: every pilot ends).
_WANTED: Final = """
SELECT j.req_millicpus, (SELECT count(*) FROM (SELECT 1 FROM tasks t
    WHERE t.job_id = w.job_id AND t.state = 'new' AND t.claim IS NULL LIMIT 1000) x) AS n
FROM job_waits w JOIN jobs j ON j.id = w.job_id
WHERE (w.reason = ANY($1::text[])
       OR (w.reason = 'host_ends' AND (w.detail->>'runs_s')::float8 <= $4))
  AND j.state IN ('active', 'configuring')
  AND j.req_millicpus <= $2 AND j.req_gpus = 0
  AND ($3::int IS NULL OR j.req_memory_mb <= $3)
"""


#: A pilot's stop margin when the scheduler's settings do not give one (the pilot's default).
_PILOT_STOP_S: Final = float(PilotMargins.model_fields["pilot_stop_s"].default)


def default_pilots_dir(namespace: str) -> Path:
    """Where a scheduler keeps its pilots' files when `VIGIL_PILOTS_DIR` is unset: in its own
    user's home, one dir per namespace (never a dir every installation shares, as `/tmp` is)."""
    return Path.home() / ".vigil" / (namespace or "default") / "pilots"


class BatchSystem(Protocol):
    """What the pool needs of a batch system (`shared/batch/slurm.py` is one)."""

    async def submit(
        self,
        script: str,
        *,
        name: str,
        cpus: int,
        memory_mb: int | None,
        walltime_s: float,
        partition: str | None,
        account: str | None,
        extra: Sequence[str] = (),
        workdir: str,
        output: str,
        env: Mapping[str, str] | None = None,
        withheld: Sequence[str] = (),
    ) -> str: ...

    async def jobs(self, job_ids: Sequence[str]) -> dict[str, BatchJob]: ...

    async def cancel(self, job_id: str, signal: str | None = None) -> None: ...


@dataclass(frozen=True)
class PilotPoolSettings:
    """The scheduler's pilot settings (`SchedulerSettings.pilots()`)."""

    backend: str  # "none": only operators' pilots, submitted if a batch system is given
    worker_pool: str
    most: int = 4
    idle_s: float = 300.0
    cpus: int = 1
    memory_mb: int | None = None
    walltime_s: int = 3600
    #: The batch jobs' scripts' dir and their output (`VIGIL_PILOTS_DIR`): the scheduler's own.
    workdir: str = field(default_factory=lambda: str(default_pilots_dir("")))
    partition: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable)
    #: Extra settings of the pilot's own (drain and stop margins...), put in its environment.
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def runs_up_to_s(self) -> float:
        """How long a task may run on a pilot asked for now: its walltime (whole minutes, as
        the batch system counts it) less the stop margin its host's end is measured by."""
        stop = float(self.env.get("VIGIL_PILOT_STOP_S", _PILOT_STOP_S))
        return math.ceil(self.walltime_s / 60) * 60 - stop


class PilotPool:
    """The pool's pilots, kept as the settings and the waiting work say."""

    def __init__(self, pool: Pool, batch: BatchSystem, settings: PilotPoolSettings) -> None:
        self._pool, self._batch, self.settings = pool, batch, settings
        # the batch jobs' output: never written where another user put a link (UnsafeDir)
        private_dir.ensure(Path(settings.workdir))
        #: Every pilot's batch script: the pilot, run by the scheduler's Python.
        self._script = f"#!/bin/sh\nexec {shlex.quote(settings.python)} -m services.pilot\n"

    async def run_once(self) -> int:
        """One look; how many pilots changed."""
        async with self._pool.acquire() as conn:
            live = await pilots_repo.listed(conn, self.settings.worker_pool, live=True)
        changed = await self._submit([p for p in live if p.state == "requested"])
        changed += await self._follow([p for p in live if p.batch_job_id is not None])
        changed += await self._cancel(
            [p for p in live if p.state == "draining" and p.batch_job_id is not None]
        )
        # read again: a pilot the follow just saw start is running, and may already hold the
        # work that made it wanted (never withdrawn as "not started")
        async with self._pool.acquire() as conn:
            live = await pilots_repo.listed(conn, self.settings.worker_pool, live=True)
        wanted = await self._wanted_cpus()
        if self.settings.backend != "none":
            changed += await self._on_demand(live, wanted)
            changed += await self._withdraw_surplus(live, wanted)
        changed += await self._retire_idle([p for p in live if p.state == "running"], wanted)
        return changed

    async def _submit(self, requested: list[Pilot]) -> int:
        for pilot in requested:
            env = {
                **self.settings.env,
                "VIGIL_PILOT_WALLTIME_S": str(pilot.walltime_s),
                "VIGIL_WORKER_POOL": pilot.pool,
            }
            try:
                batch_id = await self._batch.submit(
                    self._script,
                    name=f"vigil-{pilot.id}",
                    cpus=pilot.cpus,
                    memory_mb=pilot.memory_mb,
                    walltime_s=pilot.walltime_s,
                    partition=self.settings.partition,
                    account=self.settings.account,
                    extra=self.settings.extra,
                    workdir=self.settings.workdir,
                    output=str(Path(self.settings.workdir) / "pilot-%j.out"),
                    env=env,
                    withheld=STORE_CREDENTIALS,  # a pilot's host holds none (signed links)
                )
            except BatchError as exc:
                logger.warning("pilot %s not submitted: %s", pilot.id, exc)
                async with self._pool.acquire() as conn:
                    await pilots_repo.failed_to_submit(conn, pilot.id, f"not submitted: {exc}")
                continue
            logger.info("pilot %s submitted as batch job %s", pilot.id, batch_id)
            async with self._pool.acquire() as conn:
                await pilots_repo.submitted(conn, pilot.id, batch_id)
        return len(requested)

    async def _follow(self, submitted: list[Pilot]) -> int:
        if not submitted:
            return 0
        seen = await self._batch.jobs([p.batch_job_id for p in submitted if p.batch_job_id])
        changed = 0
        async with self._pool.acquire() as conn:
            for pilot in submitted:
                assert pilot.batch_job_id is not None
                job = seen.get(pilot.batch_job_id)
                state = pilots.state_of(job.state if job else None)
                reason = _reason(job, state)
                if (state, reason) == (pilot.state, pilot.reason) and state != "running":
                    continue
                # a job cancelled while pending shows the cancel as its start: not a run; a
                # pending one's end is the batch system's guess: no end until it runs
                running = state == "running"
                started = job.started_at if job and running else None
                ran = running or pilot.started_at is not None
                ends = _ends(job, started, pilot) if ran else None
                host = pilots.host_id(pilot.batch_job_id) if running else None
                await pilots_repo.follow(conn, pilot.id, state, reason, started, ends, host)
                changed += state != pilot.state
        return changed

    async def _cancel(self, draining: list[Pilot]) -> int:
        for pilot in draining:
            assert pilot.batch_job_id is not None
            try:
                await self._batch.cancel(pilot.batch_job_id)
            except BatchError as exc:
                logger.warning("pilot %s not cancelled yet: %s", pilot.id, exc)
        return 0

    async def _wanted_cpus(self) -> float:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                _WANTED,
                list(WANTING_HOSTS),
                self.settings.cpus * 1000,
                self.settings.memory_mb,
                self.settings.runs_up_to_s,
            )
        return float(sum(r["req_millicpus"] / 1000 * r["n"] for r in rows))

    async def _on_demand(self, live: list[Pilot], wanted: float) -> int:
        starting = sum(p.state in ("requested", "pending") for p in live)
        count = pilots.more_needed(
            wanted, self.settings.cpus, starting, len(live), self.settings.most
        )
        if count <= 0:
            return 0
        ask = pilots_repo.Ask(self.settings.cpus, self.settings.walltime_s, self.settings.memory_mb)
        async with self._pool.acquire() as conn:
            made = await pilots_repo.request(
                conn, self.settings.worker_pool, self.settings.backend, ask, count, "scheduler"
            )
        logger.info("%d pilot(s) asked for: work waits for %g cpus", len(made), wanted)
        return len(made)

    async def _withdraw_surplus(self, live: list[Pilot], wanted: float) -> int:
        """Withdraw the pilots it asked for that have not started and that the work waiting
        for a host no longer needs, the newest first (the last asked for would start last)."""
        starting = [
            p for p in live if p.state in ("requested", "pending") and p.requested_by == "scheduler"
        ]
        count = pilots.surplus(wanted, self.settings.cpus, len(starting))
        if count <= 0:
            return 0
        newest = sorted(starting, key=lambda p: (p.created_at, p.id), reverse=True)[:count]
        async with self._pool.acquire() as conn:
            for pilot in newest:
                await pilots_repo.withdraw(conn, pilot.id, "no work waits for it")
        logger.info("%d pilot(s) not started withdrawn: work waits for %g cpus", count, wanted)
        return count

    async def _retire_idle(self, running: list[Pilot], wanted: float) -> int:
        hosts = [p.host_id for p in running if p.host_id]
        if not hosts:
            return 0
        retired = 0
        async with self._pool.acquire() as conn:
            loads = await pool_repo.loads(conn, hosts)
            for pilot in running:
                load = loads.get(pilot.host_id or "")
                idle = load is not None and load.tasks == 0 and wanted <= 0
                since = await pilots_repo.idle(conn, pilot.id, idle)
                if since is None or _age_s(since) < self.settings.idle_s:
                    continue
                await pilots_repo.withdraw(conn, pilot.id, "idle")
                logger.info("pilot %s idle since %s: cancelled", pilot.id, since.isoformat())
                retired += 1
        return retired


def _reason(job: BatchJob | None, state: str) -> str | None:
    if job is None:
        return "gone from the batch system"
    if state == "ended":
        return job.state.lower()
    return job.reason if state == "pending" else None


def _ends(job: BatchJob | None, started: datetime | None, pilot: Pilot) -> datetime | None:
    """The end of a pilot's allocation that has run: the batch system's, else its start plus
    its walltime in whole minutes (what it was submitted with)."""
    if job is not None and job.ends_at is not None:
        return job.ends_at
    if started is None:
        return None
    return started + timedelta(minutes=math.ceil(pilot.walltime_s / 60))


def _age_s(since: datetime) -> float:
    return (datetime.now(UTC) - since).total_seconds()
