"""Fair share: how much each user has used lately, and the order in which users are served.

The model is HTCondor's effective user priority, made exact and charged as it goes:

    level(u) = (held(u) + recent(u)) / share(u)

`held` is the cost (`Pricing.cost`, in CPUs) of what the user's tasks in flight hold now;
`recent` is the decayed average of what they held (HTCondor's "real user priority": usage in
CPU-seconds, decayed with a half-life, times ln 2 / half-life, which is what a user holding
`x` CPUs for ever converges to: `x`). The user with the lowest level is served next, one task
at a time, and each task placed raises its user's level at once, so that one round with much
free capacity shares it out as the shares say, not all to whoever was lowest when it began.

Why this and not Slurm's factor `2^(-U/S)`: ordering by Slurm's factor is ordering by `U/S`,
the same idea, but Slurm recomputes it every few minutes from usage alone, so a burst of
free capacity goes to one user; counting what is held now makes the shares hold within a
round, and a user alone is served whatever their level (work-conserving). With the same kind
of tasks, two users end up holding capacity in the ratio of their shares: at a steady state
`recent = held`, so equal levels mean `held(a) / held(b) = share(a) / share(b)`.
"""

import math

LN2 = math.log(2)


def decayed(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """`usage` (CPU-seconds) `elapsed_s` later, nothing held meanwhile. A half-life of 0 or
    less keeps no history: fair share then looks at what is held now only."""
    if half_life_s <= 0:
        return 0.0
    return usage * math.exp(-LN2 * elapsed_s / half_life_s)


def charged(usage: float, held_cost: float, elapsed_s: float, half_life_s: float) -> float:
    """`usage` after `elapsed_s` more seconds holding `held_cost` CPUs: the old usage decayed,
    plus what was held, each second of it decayed since (the exact integral, so that the
    figure does not depend on how often the caller charges)."""
    if half_life_s <= 0:
        return 0.0
    rate = LN2 / half_life_s
    kept = math.exp(-rate * elapsed_s)
    return usage * kept + held_cost * (1 - kept) / rate


def recent(usage: float, half_life_s: float) -> float:
    """The decayed average of CPUs held that `usage` amounts to (HTCondor's real priority)."""
    return usage * LN2 / half_life_s if half_life_s > 0 else 0.0


def level(held_cost: float, usage: float, share: float, half_life_s: float) -> float:
    """A user's effective level (lower is served first); see the module's docstring."""
    return (held_cost + recent(usage, half_life_s)) / share
