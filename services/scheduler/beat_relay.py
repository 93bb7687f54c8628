"""Hosts' beats from Redis into PostgreSQL: the leader takes every beat pushed on the
board (`shared/messaging/beat_board.py`) in one round trip, writes them into `hosts` in one
transaction, and answers each service what PostgreSQL said of its host. The host's side, and
what the fence keeps, is `shared/host/beats.py`."""

import logging
import time
from typing import Final

from shared.messaging.beat_board import Answer, Beat, BeatBoard, Kind
from shared.runtime.config import default_heartbeat_s
from shared.store import hosts_repo
from shared.store.db import Pool
from shared.store.hosts_repo import RelayedBeat

logger = logging.getLogger(__name__)

#: The longest time between two takes of the board.
LONGEST_EVERY_S: Final = 1.0
#: A service this relay has not answered for this long is gone: its answer is dropped.
FORGET_AFTER_S: Final = 600.0


def every_s(dead_host_s: float) -> float:
    """How often the board is taken: twice per default heartbeat, at most every second, so
    that a beat is answered before the next one is sent."""
    return min(LONGEST_EVERY_S, default_heartbeat_s(dead_host_s) / 2)


class BeatRelay:
    """Writes the beats taken off the board into `hosts`, and answers them."""

    def __init__(
        self, pool: Pool, board: BeatBoard, forget_after_s: float = FORGET_AFTER_S
    ) -> None:
        self._pool, self._board = pool, board
        self._forget_after_s = forget_after_s
        self._started = time.monotonic()
        #: When each service (by field) was last answered by this relay.
        self._answered_at: dict[str, float] = {}
        self._forgot_at = time.monotonic()

    async def run_once(self) -> int:
        """Write the beats pushed since the last run (a service's latest, if it beat twice);
        how many were answered (their rows named their instance)."""
        now = time.monotonic()
        new = _latest(await self._board.take())
        answers = await self._write(new, now) if new else {}
        await self._board.answer(answers)
        await self._forget_gone(now)
        return len(answers)

    async def _write(self, beats: list[Beat], now: float) -> dict[str, Answer]:
        """The beats into `hosts`, in one transaction; the answers, by field."""
        workers = [_relayed(b) for b in beats if b.kind is Kind.WORKER]
        supervisors = [_relayed(b) for b in beats if b.kind is Kind.SUPERVISOR]
        async with self._pool.acquire() as conn, conn.transaction():
            # The workers' first: a supervisor's beat reads whether its worker is silent.
            read_w = await hosts_repo.relay_worker_beats(conn, workers)
            read_s = await hosts_repo.relay_supervisor_beats(conn, supervisors)
        answers = {}
        for beat in beats:
            read = (read_w if beat.kind is Kind.WORKER else read_s).get(beat.host_id)
            if read is not None:
                answers[beat.field] = Answer(beat.instance, beat.seq, read.fields())
                self._answered_at[beat.field] = now
        return answers

    async def _forget_gone(self, now: float) -> None:
        """Every `forget_after_s`, once this relay has run that long: the answers of services
        it has not answered since (hosts gone for good)."""
        after = self._forget_after_s
        if now - self._forgot_at < after or now - self._started < after:
            return
        self._forgot_at = now
        gone = [
            field
            for field in await self._board.answered()
            if now - self._answered_at.get(field, float("-inf")) > after
        ]
        await self._board.forget(gone)
        for field in gone:
            self._answered_at.pop(field, None)


def _latest(beats: list[Beat]) -> list[Beat]:
    """Each service's latest beat, in the order of their hosts (the rows' lock order)."""
    latest: dict[str, Beat] = {}
    for beat in beats:
        if beat.field not in latest or latest[beat.field].seq < beat.seq:
            latest[beat.field] = beat
    return sorted(latest.values(), key=lambda b: (b.host_id, b.kind))


def _relayed(beat: Beat) -> RelayedBeat:
    return RelayedBeat(beat.host_id, beat.instance, beat.age_s, beat.dead_worker_s)
