"""Quarantine as a circuit breaker (design §5, issue 13): a host is shut when failures it is
blamed for pile up, and probes its way back.

    closed --(quarantine_after blamed failures within the window)--> shut
    shut   --(its cool-down has passed)----------------------------> probing
    probing --(a command started since ends, not blamed on the host)--> closed
    probing --(an attempt started since is blamed on the host)---> shut, cool-down doubled

A shut host takes no task of its pool (its worker stops consuming the pool queue); a probing
one takes one at a time (`services/worker/consumer.py`), so a pool whose every host is shut
still makes progress, a task at a time, and heals. The first cool-down is
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
from shared.store import outbox
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


def next_cooldown(current_s: float | None, settings: BreakerSettings) -> float:
    """The cool-down after a failed probe: twice the last one, within the cap."""
    return min((current_s or settings.first_s) * 2, settings.max_cooldown_s)


_TRIP = """
UPDATE hosts h SET quarantined = true, breaker = true, probing_since = NULL,
    cooldown_s = $3, quarantined_until = now() + make_interval(secs => $3),
    quarantine_reason = $2 || ' tasks lost within ' || $4::text || ' s'
WHERE h.id = $1 AND NOT h.quarantined AND $2 <= (SELECT count(*) FROM attempts a
    WHERE a.host = $1 AND a.failure_class::text = ANY($5::text[])
      AND a.ended_at > greatest(now() - make_interval(secs => $4),
                                  coalesce(h.quarantined_until, '-infinity')))
RETURNING h.id, h.quarantined_until, h.quarantine_reason
"""

#: Shut breakers whose cool-down has passed let one task through.
_TO_PROBING = """
UPDATE hosts SET probing_since = now()
WHERE breaker AND quarantined AND probing_since IS NULL AND quarantined_until <= now()
RETURNING id, quarantined_until, quarantine_reason
"""

#: A probe failed: an attempt started there since probing began is blamed on the host.
_PROBE_FAILED = """
UPDATE hosts h SET probing_since = NULL, cooldown_s = least(h.cooldown_s * 2, $2),
    quarantined_until = now() + make_interval(secs => least(h.cooldown_s * 2, $2)),
    quarantine_reason = 'probe failed (' || f.failure_class::text || '): '
        || coalesce(f.error_brief, 'no detail')
FROM hosts o CROSS JOIN LATERAL (
    SELECT a.failure_class, a.error_brief FROM attempts a
    WHERE a.host = o.id AND a.started_at >= o.probing_since
      AND a.failure_class::text = ANY($1::text[])
    ORDER BY a.started_at LIMIT 1) f
WHERE h.id = o.id AND o.breaker AND o.probing_since IS NOT NULL
RETURNING h.id, h.quarantined_until, h.quarantine_reason
"""

#: A probe succeeded: a command started there since probing began ended (its cluster or
#: post-processing stage; a setup alone proves little), not blamed on the host (a program's
#: own failure proves the host runs programs). Failures before now no longer count towards
#: the next trip (`quarantined_until` marks the end).
_PROBE_PASSED = """
UPDATE hosts h SET quarantined = false, breaker = false, probing_since = NULL,
    cooldown_s = NULL, quarantined_until = now(), quarantine_reason = NULL
WHERE h.breaker AND h.probing_since IS NOT NULL AND EXISTS (SELECT 1 FROM attempts a
    WHERE a.host = h.id AND a.started_at >= h.probing_since AND a.ended_at IS NOT NULL
      AND a.stage IN ('cluster', 'post_processing')
      AND (a.failure_class IS NULL OR a.failure_class::text <> ALL($1::text[])))
RETURNING h.id, NULL::timestamptz AS quarantined_until, 'a probe task ran' AS quarantine_reason
"""

#: An operator's quarantine that has run out.
_RUN_OUT = """
UPDATE hosts SET quarantined = false, quarantine_reason = NULL
WHERE quarantined AND NOT breaker AND quarantined_until <= now()
RETURNING id, NULL::timestamptz AS quarantined_until, 'its quarantine ran out' AS quarantine_reason
"""


async def trip(conn: Connection, host: str, settings: BreakerSettings) -> bool:
    """In the caller's transaction (a blamed failure was just decided): shut the host if it
    has `trip_after` blamed failures within the window. True if it was shut now."""
    if settings.trip_after <= 0:
        return False
    row = await conn.fetchrow(
        _TRIP, host, settings.trip_after, settings.first_s, settings.window_s, list(BLAMED)
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
        failed = await conn.fetch(_PROBE_FAILED, list(BLAMED), settings.max_cooldown_s)
        await _announce(conn, failed, HostState.QUARANTINED)
        passed = await conn.fetch(_PROBE_PASSED, list(BLAMED))
        await _announce(conn, passed, HostState.RELEASED)
        probing = await conn.fetch(_TO_PROBING)
        await _announce(conn, probing, HostState.PROBING)
        ran_out = await conn.fetch(_RUN_OUT)
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
