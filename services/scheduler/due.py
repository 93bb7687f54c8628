"""When a step of the round that most often has nothing to do should look anyway.

The triage and the waiters each cost a query per round, and under load a round runs for
nearly every commit. They look only when told that something may be there (the relay saw an
event that can give them work), after a pass that left something (there may be more), and at
least every `every_s` (a safety sweep: what no event announces, such as a prerequisite that
was already out of reach when its task was submitted, or a fence that timed out).
"""

import heapq
import math
from dataclasses import dataclass, field
from typing import Final


@dataclass
class Due:
    """A step's schedule: `due(now)` before it runs, `ran(left, now)` after.

    `tell()` makes the next round look. What needs a look but not at once makes a round look
    once a gap has passed since the last look ended: `tell_soon()` (a task ended,
    and what waited on it may fit now; `soon_in` says when, for the round to wake then), or a
    pass that left work (any round after the gap looks again). Under load task ends come many
    to a look's time, and one look places what all of them freed.

    The gap is `gap_per_look` times the last look's own time, at most `gap_s` (without
    `gap_per_look`: `gap_s`): the step spends at most 1 / (1 + `gap_per_look`) of the time
    looking for what task ends freed. And once `soon_enough` ends have come since the last
    look (set to a tenth of the pool's CPUs, `soon_enough_for`), the next round looks
    whatever the gap, and where one end is enough (ten CPUs or fewer) there is no gap at all:
    a small installation looks as often as without one (its two CPUs idle through any gap:
    a gap of twice the look cost one host of two CPUs 6 to 9 % of its short commands), and a
    large one places a tenth of the pool's capacity or what the gap freed at each look.
    """

    every_s: float
    gap_s: float = 0.0
    gap_per_look: float = 0.0
    #: Ends (`tell_soon`) after which a look is due at once (0: only the gap counts).
    soon_enough: int = 0
    _told: bool = True  # the first round looks
    _soon: int = 0  # ends told since the last look
    _left: bool = False
    _next: float = 0.0
    _last: float = float("-inf")  # when the last look ended
    _took: float = 0.0  # how long it took

    def tell(self) -> None:
        """Something the step acts on may have appeared: look in the next round."""
        self._told = True

    def tell_soon(self) -> None:
        """Something the step acts on may have appeared: look a gap after the last look (or at
        once, once `soon_enough` such tells have come)."""
        self._soon += 1

    def due(self, now: float) -> bool:
        """Whether the step runs now; if so, what it was told so far is taken (a tell that
        comes while it runs makes the next round look again)."""
        later = self._soon > 0 or self._left
        if self._now() or now >= self._next or (later and now >= self._last + self.gap()):
            self._told, self._soon = False, 0
            return True
        return False

    def _now(self) -> bool:
        """Whether a look is wanted at once."""
        return self._told or 0 < self.soon_enough <= self._soon

    def ran(self, left: bool, now: float, took_s: float = 0.0) -> None:
        """The step ran at `now`, for `took_s`; `left`: it found work it did not finish (look
        again in a round a gap after it)."""
        self._left, self._last, self._next = left, now + took_s, now + self.every_s
        self._took = took_s

    def gap(self) -> float:
        """How long after the last look a look for what needs one but not at once is due: none
        where a single task's end is enough for a look (a pool of ten CPUs or fewer)."""
        if self.soon_enough == 1:
            return 0.0
        if self.gap_per_look:
            return min(self.gap_s, self.gap_per_look * self._took)
        return self.gap_s

    def soon_in(self, now: float) -> float | None:
        """Seconds from `now` until a look it was told of is due (None: none)."""
        if self._now():
            return 0.0
        if self._soon:
            return max(0.0, self._last + self.gap() - now)
        return None


#: A look is due once task ends have freed this share of the pool's CPUs (`Due.soon_enough`).
FREED_PER_LOOK: Final = 0.1


def soon_enough_for(cpus: int) -> int:
    """After how many task ends a look is due at once, for a pool of `cpus` CPUs: a tenth of
    them, at least one."""
    return max(1, math.ceil(cpus * FREED_PER_LOOK))


@dataclass
class Pace:
    """How long the scheduling round waits when it found nothing to do.

    `tick_s` after a round that did something, or that a notification or an event woke
    (`stir`); twice as long after each idle round, up to `max_s` (what no notification or
    event announces is then found within `max_s`); never past a moment something is known to
    become releasable (`due_in`: a resubmitted task's backoff).
    """

    tick_s: float
    max_s: float
    _wait: float = 0.0  # the next idle wait
    _waiting: float = 0.0  # the wait under way (the last one given)
    _due: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._wait = self.tick_s

    @property
    def slowed(self) -> bool:
        """Whether the round sleeps longer than `tick_s` now (what it was last given)."""
        return self._waiting > self.tick_s

    def stir(self) -> None:
        """Something happened: the next idle wait is `tick_s` again."""
        self._wait = self._waiting = self.tick_s

    def due_in(self, seconds: float, now: float) -> None:
        """Something becomes releasable `seconds` after `now`: look then."""
        heapq.heappush(self._due, now + max(0.0, seconds))

    def idle_wait(self, now: float) -> float:
        """The wait after an idle round that began at `now` (the next idle round waits
        longer); a moment passed before the round began was looked at by it."""
        wait = min(self._wait, self.max_s)
        self._wait = min(self._wait * 2, self.max_s)
        while self._due and self._due[0] + _CLOCK_SLACK_S <= now:
            heapq.heappop(self._due)  # passed: this round has looked
        if self._due and self._due[0] < now + wait:
            wait = max(0.0, heapq.heappop(self._due) - now + _CLOCK_SLACK_S)
        self._waiting = wait
        return wait


def relay_wait(quiet_s: float, poll_s: float, nudge_every_s: float) -> float:
    """How long the relay waits for a notification before it looks anyway, after `quiet_s`
    without one or a batch (`poll_s`: `VIGIL_RELAY_POLL_S`).

    Events of quiet states (`shared.domain.states.QUIET`) notify nobody, but a worker that writes
    one nudges the relay within `NUDGE_DELAY_S`, or has less than `nudge_every_s` before
    (`shared/store/transition_writer.py`): polling every `poll_s` for twice that long and one poll
    more finds each within `poll_s` of it.
    After a longer quiet spell nothing waits but what a failed nudge left: looked at every
    2 s."""
    if quiet_s < 2 * nudge_every_s + poll_s:
        return poll_s
    return max(poll_s, _RELAY_SLOW_S)


_RELAY_SLOW_S = 2.0


def gather_wait(relayed: int, before: int, gather_s: float) -> float:
    """How long the relay waits before its next read, after a read that published `relayed`
    rows and one before it that published `before`: two busy reads in a row say the system
    is busy, and what it writes for `gather_s` more goes out together (fewer and fuller
    batches, each one statement). After a read that followed a quiet moment, nothing waits:
    the quiet path's moves come milliseconds apart, and the next one (a submission's
    `RunStage`) is not held back. (A threshold on the batch's size instead held busy runs
    at small batches half the time: batches fill only once the relay gathers.)"""
    return gather_s if relayed and before else 0.0


#: A backoff ends at PostgreSQL's `now()`; the round looks that much after it, not before.
_CLOCK_SLACK_S = 0.01
