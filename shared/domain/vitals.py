"""Signs of life of a running command, and the pure judgement of hang and walltime."""

from dataclasses import dataclass, replace

from shared.domain.outcomes import Outcome, hung_outcome, walltime_outcome


@dataclass(frozen=True)
class Vitals:
    """Wall-clock times (epoch seconds): when the command started, and its last sign of life."""

    started: float
    last_sign: float

    def seen(self, at: float | None) -> "Vitals":
        """These vitals with a sign of life at `at` (ignored if None or older)."""
        if at is None or at <= self.last_sign:
            return self
        return replace(self, last_sign=at)


def verdict(
    now: float, vitals: Vitals, hang_timeout: float | None, walltime: float | None
) -> Outcome | None:
    """`walltime` once it ran longer than `walltime`; `hung` once silent longer than
    `hang_timeout`; None while it is fine (or nothing is set)."""
    if walltime is not None and now - vitals.started > walltime:
        return walltime_outcome(walltime)
    silent = now - vitals.last_sign
    if hang_timeout is not None and silent > hang_timeout:
        return hung_outcome(silent)
    return None
