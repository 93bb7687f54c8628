"""Ending jobs: an active job whose tasks are all terminal becomes completed or failed.

Every ended job's Redis keys are purged, twice (a late writer may add one): the jobs this
finaliser ends, and the jobs that someone cancelled (told by the relay as their `job.cancelled`
is published, and found by their `finished_at` at every sweep).
"""

import logging
import time
from collections import deque
from collections.abc import Iterable
from datetime import datetime

from redis.asyncio import Redis

from shared.domain.errors import UNAVAILABLE
from shared.domain.states import JobState
from shared.messaging.redis_keys import RedisKeys
from shared.store import jobs_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)


#: A job's keys are purged again this long after it ended: a worker still draining the output
#: of a killed command (or just woken from a freeze) may write its exit note or progress late.
REPURGE_AFTER_S = 15.0
#: The keys of the jobs ended (or cancelled) since the last purge are purged together at most
#: this often: under W1 a round ends a job or two, and a purge a round was a Redis round trip
#: for each (3.5 % of the leader's samples). They are ephemeral, with TTLs: a second later
#: costs nothing.
PURGE_EVERY_S = 1.0
#: On start, cancelled jobs this far back are purged too (the keys expire on their own anyway).
CANCELLED_LOOKBACK_S = 86_400.0
#: Every active job is looked at this often (and on the first round); in between, only the
#: jobs a task ended in (`touch`: told by the notification of its commit) or was decided in.
#: The sweep is an index probe per active job.
SWEEP_EVERY_S = 2.0
#: A job found unfinished is looked at again at most this often. A big job has a task end
#: every few ms under load, and each look is a statement (0.36 ms a call over one job x
#: 5,000, nearly a call per task); its end is then seen up to this much later (and the
#: round's clock slack, `due.Pace`: 10 ms). A job not looked at lately (a one-task job, the
#: first end in a job) is looked at in the next round.
RELOOK_AFTER_S = 0.02
#: A job that the last planning round saw with a task to place, told of since, is looked at
#: by the next round that does not see it so, or this long after that read at the latest
#: (`Finaliser.unfinished`). Rounds place work a gap apart under load (at most
#: `release_gap_s`, 0.1 s by default).
WAITING_HOLD_S = 0.5

_CANCELLED_SINCE = (
    "SELECT id, finished_at FROM jobs WHERE state = 'cancelled' AND finished_at IS NOT NULL"
    " AND (finished_at, id) > (coalesce($1, now() - make_interval(secs => $2)), $3)"
    " ORDER BY finished_at, id LIMIT $4"
)


class Finaliser:
    """Gives finished jobs their final state and `job.succeeded` / `job.failed` event."""

    def __init__(
        self,
        pool: Pool,
        redis: Redis,
        keys: RedisKeys,
        batch: int,
        *,
        relook_after_s: float = RELOOK_AFTER_S,
        sweep_every_s: float = SWEEP_EVERY_S,
        waiting_hold_s: float = WAITING_HOLD_S,
        purge_every_s: float = PURGE_EVERY_S,
    ) -> None:
        self._pool, self._redis, self._keys, self._batch = pool, redis, keys, batch
        self._relook_after_s, self._sweep_every_s = relook_after_s, sweep_every_s
        self._waiting_hold_s = waiting_hold_s
        self._repurge: deque[tuple[float, str]] = deque()
        #: The jobs ended or cancelled since the last purge, and when the next one is due.
        self._to_purge: list[str] = []
        self._purge_every_s, self._next_purge = purge_every_s, 0.0
        #: The jobs told of, each with when it was last told (monotonic).
        self._touched: dict[str, float] = {}
        #: When each job told of was last found unfinished (monotonic; kept `relook_after_s`).
        self._unfinished_at: dict[str, float] = {}
        #: The jobs the last read saw with a task to place, and when it began (`unfinished`).
        self._waiting_at: dict[str, float] = {}
        self._cancelled: set[str] = set()
        self._next_sweep = 0.0
        # (finished_at, id) of the last cancelled job purged
        self._cancelled_after: tuple[datetime | None, str] = (None, "")
        #: Looks at the jobs told of, and jobs told of that needed none (`unfinished`), for
        #: benchmarks and tests.
        self.looks = 0
        self.spared = 0

    def touch(self, job_id: str) -> None:
        """A task of `job_id` ended (or was decided): look at the job in the next round."""
        self._touched[job_id] = time.monotonic()

    def unfinished(self, job_ids: Iterable[str], read_from: float) -> None:
        """A read that began at `read_from` (monotonic) saw `job_ids` each with a task still
        to place: they were unfinished then. A job told of before that, and not since, needs
        no look: what it was told of (the notification of a commit, which a read begun after
        it sees) had not finished the job. One told of after it waits for the next such read
        (the next planning round's), at most `waiting_hold_s`: under load a big job has a
        task end every few ms and nearly every round sees its waiting tasks."""
        self._waiting_at = dict.fromkeys(job_ids, read_from)
        for job_id in self._waiting_at:
            told = self._touched.get(job_id)
            if told is not None and told < read_from:
                del self._touched[job_id]
                self.spared += 1

    def cancelled(self, job_id: str) -> None:
        """Someone cancelled `job_id`: purge its keys in the next round."""
        self._cancelled.add(job_id)

    def _held_until(self, job_id: str) -> float | None:
        """Until when a look at `job_id` waits (monotonic): found unfinished by a look
        lately, or seen with a task to place by the last read; None if it waits for nothing."""
        found = self._unfinished_at.get(job_id)
        seen = self._waiting_at.get(job_id)
        holds = []
        if found is not None:
            holds.append(found + self._relook_after_s)
        if seen is not None:
            holds.append(seen + self._waiting_hold_s)
        return max(holds) if holds else None

    @property
    def pending(self) -> bool:
        """Whether jobs told of wait for the next round (one it could not lock was skipped),
        not counting those whose look waits (`next_look`)."""
        now = time.monotonic()
        return any(
            (held := self._held_until(job_id)) is None or held <= now for job_id in self._touched
        )

    def next_look(self) -> float | None:
        """When (monotonic) the first job told of whose look waits is due it; None if none
        waits."""
        holds = [self._held_until(job_id) for job_id in self._touched]
        waiting = [held for held in holds if held is not None]
        return min(waiting) if waiting else None

    def _take_due(self, now: float) -> list[str]:
        """The jobs told of that are due a look now (taken from those told of)."""
        self._unfinished_at = {
            job_id: at
            for job_id, at in self._unfinished_at.items()
            if now - at < self._relook_after_s
        }
        due = sorted(
            job_id
            for job_id in self._touched
            if (held := self._held_until(job_id)) is None or held <= now
        )
        for job_id in due:
            del self._touched[job_id]
        return due

    async def run_once(self) -> int:
        """Finalise the jobs that may have finished; returns how many ended. The jobs told of
        that are due a look, and at a sweep every active job that looks finished, are ended in
        one statement (`jobs_repo.end_finished`); the keys of every job ended, cancelled, or
        due its second purge go in one round trip to Redis, at most every `purge_every_s`."""
        now = time.monotonic()
        sweep = now >= self._next_sweep
        since = await self._cancelled_since() if sweep else []
        self._to_purge += sorted(self._cancelled.union(since))
        self._cancelled = set()
        ended: dict[str, JobState] = {}
        async with self._pool.acquire() as conn:
            found: list[str] = []
            if sweep:  # every active job that looks finished, with those told of
                self._next_sweep = now + self._sweep_every_s
                candidates = await jobs_repo.finished_candidates(conn, self._batch)
                found = [job_id for job_id, _ in candidates]
            due = sorted(set(self._take_due(now)).union(found))
            if due:
                ended, skipped = await jobs_repo.end_finished(conn, due)
                self.looks += 1
                self._touched.update(dict.fromkeys(skipped, now))
                for job_id in due:
                    if job_id not in ended and job_id not in skipped:
                        self._unfinished_at[job_id] = now
        for job_id, state in ended.items():
            logger.info("job %s %s", job_id, state.value, extra={"job_id": job_id})
        self._to_purge += ended
        if now >= self._next_purge:
            self._next_purge = now + self._purge_every_s
            purging, self._to_purge = self._to_purge, []
            await self._purge(*purging, *self._repurge_due(now))
            self._repurge.extend((time.monotonic() + REPURGE_AFTER_S, job) for job in purging)
        return len(ended)

    async def _cancelled_since(self) -> list[str]:
        """The jobs cancelled since the last sweep (by the api, not here), to purge."""
        async with self._pool.acquire() as conn:
            after, after_id = self._cancelled_after
            rows = await conn.fetch(
                _CANCELLED_SINCE, after, CANCELLED_LOOKBACK_S, after_id, self._batch
            )
        for row in rows:
            self._cancelled_after = (row["finished_at"], row["id"])
        return [row["id"] for row in rows]

    def _repurge_due(self, now: float) -> list[str]:
        """The jobs due their second purge (taken from those waiting for it)."""
        due = []
        while self._repurge and self._repurge[0][0] <= now:
            due.append(self._repurge.popleft()[1])
        return due

    async def _purge(self, *job_ids: str) -> None:
        """Drop the jobs' ephemeral keys (one round trip); Redis being away only delays that
        (keys have TTLs)."""
        keys = [key for job_id in job_ids for key in self._keys.job_keys(job_id)]
        if not keys:
            return
        try:
            await self._redis.delete(*keys)
        except UNAVAILABLE as exc:
            logger.warning("could not purge Redis keys of jobs %s: %s", ", ".join(job_ids), exc)
