"""Suspensions kept: a command of a suspended job is stopped, one of a running job is not.

A job's suspend and resume reach its commands as `FreezeTask` messages (SIGSTOP / SIGCONT to
the tree). One that is lost (dead-lettered after five failed deliveries, or sent while this
supervisor was restarting) left a command running while its job is suspended, or stopped
after its job was resumed, which only a hang timeout would ever notice. At every reconcile the
supervisor compares each `on_cpu` command of its host with its job's state and signals what
differs (`owed`); a command stopped while its job runs is continued even if something else
stopped it, since a stopped command of a running job can only hang.

A difference is acted on only when two reconciles in a row saw it (`Suspensions`): the state
read at one may be a moment older than a suspend or resume whose `FreezeTask` is being done
right then, and acting on it would undo that order until the next reconcile.
"""

import signal
from dataclasses import dataclass, field
from uuid import UUID

#: The stopped state of /proc/<pid>/stat (`t`, stopped by a tracer, is left to the tracer).
_STOPPED = "T"


def owed(suspended: bool, state: str | None) -> signal.Signals | None:
    """The signal a command in `state` (its leader's /proc state letter; None: gone) owes to
    its job being `suspended` or not, or None when it is as it should be."""
    if state is None or state in ("Z", "X", "t"):
        return None
    if suspended and state != _STOPPED:
        return signal.SIGSTOP
    if not suspended and state == _STOPPED:
        return signal.SIGCONT
    return None


@dataclass
class Suspensions:
    """What each command owed at the last reconcile, to act only on a difference seen twice."""

    _owed: dict[tuple[str, UUID], signal.Signals] = field(default_factory=dict)
    _seen: dict[tuple[str, UUID], signal.Signals] = field(default_factory=dict)

    def confirmed(self, task_id: str, claim: UUID, sig: signal.Signals | None) -> bool:
        """Record what the command owes this round; True when it owed the same last round."""
        key = (task_id, claim)
        if sig is not None:
            self._seen[key] = sig
        return sig is not None and self._owed.get(key) is sig

    def next_round(self) -> None:
        """End a round: what was seen in it is what the next one compares with."""
        self._owed, self._seen = self._seen, {}
