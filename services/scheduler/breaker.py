"""Quarantine as a circuit breaker (design §5): a host is shut when failures it is
blamed for pile up, and probes its way back.

    closed --(quarantine_after blamed failures within the window)--> shut
    shut   --(its cool-down has passed)----------------------------> probing
    probing --(a command started since ends, not blamed on the host)--> closed
    probing --(an attempt started since is blamed on the host)---> shut, cool-down doubled

The planning round places no new task on a shut host, and one at a time on a probing one
(`services/scheduler/planning.py`: `_one_each_on`), so a pool whose every host is shut still
makes progress, a task at a time, and heals. The first cool-down is
`quarantine_probe_s`; each failed probe doubles it, up to `quarantine_s`. An operator's
quarantine is not a breaker: it lasts until it runs out or is released
(`shared/operations/quarantine.py`).

Every change is one statement with its `host.<state>.<host>` event in the outbox, in the
caller's transaction (the triage's, for a trip) or in one of its own.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from asyncpg import Record

from shared.domain.analyser import BLAMES_HOST
from shared.domain.messages import HostEvent, HostState
from shared.store import hosts_repo, outbox
from shared.store.db import Connection, Pool

logger = logging.getLogger(__name__)

#: The failure classes that count against a host, as text for the statements.
BLAMED: tuple[str, ...] = tuple(sorted(c.value for c in BLAMES_HOST))


@dataclass(frozen=True)
class BreakerSettings:
    trip_after: int  # blamed failures within the window; 0: never trips
    window_s: float
    first_cooldown_s: float
    max_cooldown_s: float

    @property
    def first_s(self) -> float:
        return min(self.first_cooldown_s, self.max_cooldown_s)


async def trip(conn: Connection, host: str, settings: BreakerSettings) -> bool:
    """In the caller's transaction (a blamed failure was just decided): shut the host if it
    has `trip_after` blamed failures within the window. True if it was shut now."""
    if settings.trip_after <= 0:
        return False
    row = await hosts_repo.trip(
        conn, host, settings.trip_after, settings.first_s, settings.window_s, list(BLAMED)
    )
    if row is None:
        return False
    await _announce(conn, [row], HostState.QUARANTINED)
    logger.warning("host %s quarantined: %s", host, row["quarantine_reason"])
    return True


async def sweep(pool: Pool, settings: BreakerSettings) -> int:
    """Move every breaker that is due (probes failed, probes passed, cool-downs over) and end
    operators' quarantines that ran out; returns how many hosts changed."""
    changed = 0
    async with pool.acquire() as conn, conn.transaction():
        failed = await hosts_repo.fail_probes(conn, list(BLAMED), settings.max_cooldown_s)
        await _announce(conn, failed, HostState.QUARANTINED)
        passed = await hosts_repo.pass_probes(conn, list(BLAMED))
        await _announce(conn, passed, HostState.RELEASED)
        probing = await hosts_repo.start_probes(conn)
        await _announce(conn, probing, HostState.PROBING)
        ran_out = await hosts_repo.end_run_out(conn)
        await _announce(conn, ran_out, HostState.RELEASED, by="operator")
        changed = len(failed) + len(passed) + len(probing) + len(ran_out)
    for row in failed:
        logger.warning("host %s shut again: %s", row["id"], row["quarantine_reason"])
    for row in passed:
        logger.info("host %s released: a probe task ran there", row["id"])
    for row in probing:
        logger.info("host %s probing: one task at a time", row["id"])
    return changed


async def _announce(
    conn: Connection, rows: Sequence[Record], state: HostState, by: str = "breaker"
) -> None:
    for row in rows:
        until: datetime | None = row["quarantined_until"]
        await outbox.add_host_event(
            conn,
            HostEvent(
                host=row["id"],
                state=state,
                reason=row["quarantine_reason"],
                until=until if state is HostState.QUARANTINED else None,
                by=by,
            ),
        )
