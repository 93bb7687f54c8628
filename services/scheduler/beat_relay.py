"""Hosts' beats from Redis into PostgreSQL (issue 41): the leader reads every beat on the board
(`shared/messaging/beat_board.py`) in one round trip, writes the new ones into `hosts` in one
transaction, and answers each service what PostgreSQL said of its host. The host's side, and
what the fence keeps, is `shared/host/beats.py`."""

import dataclasses
import logging
from typing import Final

from shared.messaging.beat_board import FORGET_AFTER_S, Answer, Beat, BeatBoard, Kind
from shared.runtime.config import default_heartbeat_s
from shared.store import hosts_repo
from shared.store.db import Pool
from shared.store.hosts_repo import RelayedBeat

logger = logging.getLogger(__name__)

#: The longest time between two reads of the board.
LONGEST_EVERY_S: Final = 1.0


def every_s(dead_host_s: float) -> float:
    """How often the board is read: twice per default heartbeat, at most every second, so
    that a beat is answered before the next one is sent."""
    return min(LONGEST_EVERY_S, default_heartbeat_s(dead_host_s) / 2)


class BeatRelay:
    """Writes the beats on the board into `hosts`, each once."""

    def __init__(self, pool: Pool, board: BeatBoard) -> None:
        self._pool, self._board = pool, board
        #: Each service's last beat written (by field: instance and number).
        self._written: dict[str, tuple[str, int]] = {}

    async def run_once(self) -> int:
        """Write the beats not written yet; how many were answered (their rows named their
        instance)."""
        beats = await self._board.read()
        gone = [b.field for b in beats if b.age_s > FORGET_AFTER_S]
        if gone:
            await self._board.forget(gone)
            for field in gone:
                self._written.pop(field, None)
        new = sorted(
            (b for b in beats if b.age_s <= FORGET_AFTER_S and not self._seen(b)),
            key=lambda b: (b.host_id, b.kind),
        )
        if not new:
            return 0
        workers = [_relayed(b) for b in new if b.kind is Kind.WORKER]
        supervisors = [_relayed(b) for b in new if b.kind is Kind.SUPERVISOR]
        async with self._pool.acquire() as conn, conn.transaction():
            # The workers' first: a supervisor's beat reads whether its worker is silent.
            read_w = await hosts_repo.relay_worker_beats(conn, workers)
            read_s = await hosts_repo.relay_supervisor_beats(conn, supervisors)
        answers = {}
        for beat in new:
            self._written[beat.field] = (beat.instance, beat.seq)
            read = (read_w if beat.kind is Kind.WORKER else read_s).get(beat.host_id)
            if read is not None:
                answers[beat.field] = Answer(beat.instance, beat.seq, dataclasses.asdict(read))
        await self._board.answer(answers)
        return len(answers)

    def _seen(self, beat: Beat) -> bool:
        return self._written.get(beat.field) == (beat.instance, beat.seq)


def _relayed(beat: Beat) -> RelayedBeat:
    return RelayedBeat(beat.host_id, beat.instance, beat.age_s, beat.dead_worker_s)
