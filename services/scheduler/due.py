"""When a step of the round that most often has nothing to do should look anyway.

The triage and the waiters each cost a query per round, and under load a round runs for
nearly every commit. They look only when told that something may be there (the relay saw an
event that can give them work), after a pass that left something (there may be more), and at
least every `every_s` (a safety sweep: what no event announces, such as a prerequisite that
was already out of reach when its task was submitted, or a fence that timed out).
"""

import heapq
from dataclasses import dataclass, field


@dataclass
class Due:
    """A step's schedule: `due(now)` before it runs, `ran(left, now)` after.

    `tell()` makes the next round look. What needs a look but not at once makes a round look
    once `gap_s` has passed since the last look (issue 41): `tell_soon()` (a task ended, and
    what waited on it may fit now; `soon_in` says when, for the round to wake then), or a
    pass that left work (any round after the gap looks again). Under load task ends come many
    to a round's time, and one look places what all of them freed.
    """

    every_s: float
    gap_s: float = 0.0
    _told: bool = True  # the first round looks
    _soon: bool = False
    _left: bool = False
    _next: float = 0.0
    _last: float = float("-inf")

    def tell(self) -> None:
        """Something the step acts on may have appeared: look in the next round."""
        self._told = True

    def tell_soon(self) -> None:
        """Something the step acts on may have appeared: look `gap_s` after the last look."""
        self._soon = True

    def due(self, now: float) -> bool:
        """Whether the step runs now; if so, what it was told so far is taken (a tell that
        comes while it runs makes the next round look again)."""
        later = self._soon or self._left
        if self._told or now >= self._next or (later and now >= self._last + self.gap_s):
            self._told = self._soon = False
            return True
        return False

    def ran(self, left: bool, now: float) -> None:
        """The step ran at `now`; `left`: it found work it did not finish (look again in a
        round `gap_s` from now)."""
        self._left, self._last, self._next = left, now, now + self.every_s

    def soon_in(self, now: float) -> float | None:
        """Seconds from `now` until a look it was told of is due (None: none)."""
        if self._told:
            return 0.0
        if self._soon:
            return max(0.0, self._last + self.gap_s - now)
        return None


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
