"""When a step of the round that most often has nothing to do should look anyway.

The triage and the waiters each cost a query per round, and under load a round runs for
nearly every commit. They look only when told that something may be there (the relay saw an
event that can give them work), after a pass that left something (there may be more), and at
least every `every_s` (a safety sweep: what no event announces, such as a prerequisite that
was already out of reach when its task was submitted, or a fence that timed out).
"""

from dataclasses import dataclass


@dataclass
class Due:
    """A step's schedule: `due(now)` before it runs, `ran(left, now)` after."""

    every_s: float
    _told: bool = True  # the first round looks
    _left: bool = False
    _next: float = 0.0

    def tell(self) -> None:
        """Something the step acts on may have appeared: look in the next round."""
        self._told = True

    def due(self, now: float) -> bool:
        """Whether the step runs now; if so, what it was told so far is taken (a tell that
        comes while it runs makes the next round look again)."""
        if self._told or self._left or now >= self._next:
            self._told = False
            return True
        return False

    def ran(self, left: bool, now: float) -> None:
        """The step ran at `now`; `left`: it found work it did not finish (look again)."""
        self._left, self._next = left, now + self.every_s
