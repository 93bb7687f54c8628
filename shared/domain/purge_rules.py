"""When a job may be purged, and what the answer says when it may not: pure decisions.

A purge removes a finished job's logs, kept outputs and work dirs for good. It is refused
while anything could still need them: the job not ended, a task still running or held, a
failure the triage has not decided about, a job chained from it that has not ended, or a purge
already done.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from shared.domain.errors import Refusal
from shared.domain.states import JobState

#: The job states a purge is allowed in.
PURGEABLE: Final = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
#: Most busy tasks (or chained jobs) named in a refusal.
NAMED: Final = 5


@dataclass(frozen=True)
class JobFacts:
    """What the decision needs to know about the job, read under its row lock."""

    job_id: str
    state: JobState
    purged_at: datetime | None = None
    purged_by: str | None = None
    #: (task id, state) of its tasks in flight, holding a claim or awaiting triage (up to
    #: NAMED + 1 of them).
    busy: Sequence[tuple[str, str]] = ()
    #: Jobs chained from it (`inputs_from`) that have not ended (up to NAMED + 1).
    downstream: Sequence[str] = ()


def purged_message(job_id: str, purged_at: datetime, purged_by: str | None) -> str:
    """`job X was purged at T by U`: the start of every refusal about a purged job."""
    by = f" by {purged_by}" if purged_by else ""
    return f"job {job_id} was purged at {purged_at.isoformat(timespec='seconds')}{by}"


def _busy(facts: JobFacts) -> str:
    named = ", ".join(f"{task} ({state})" for task, state in facts.busy[:NAMED])
    return named + (" and more" if len(facts.busy) > NAMED else "")


def refusal(facts: JobFacts) -> Refusal | None:
    """Why the job cannot be purged now, and what to do, or None when it can be."""
    if facts.purged_at is not None:
        return Refusal(
            purged_message(facts.job_id, facts.purged_at, facts.purged_by) + " already",
            "nothing is left to purge",
        )
    if facts.state not in PURGEABLE:
        allowed = ", ".join(sorted(s.value for s in PURGEABLE))
        running = f"; tasks still running or held: {_busy(facts)}" if facts.busy else ""
        return Refusal(
            f"cannot purge job {facts.job_id} in state {facts.state.value}: only a job that"
            f" has ended ({allowed}) can be purged{running}",
            f"to end it now, cancel it (`vigil cancel {facts.job_id}`, or the action cancel),"
            " then purge it once its tasks have stopped",
        )
    if facts.busy:
        return Refusal(
            f"cannot purge job {facts.job_id}: tasks still running or held: {_busy(facts)}",
            "wait for them to end, then purge it",
        )
    if facts.downstream:
        named = ", ".join(facts.downstream[:NAMED])
        more = " and more" if len(facts.downstream) > NAMED else ""
        return Refusal(
            f"cannot purge job {facts.job_id}: jobs chained from it have not ended and may"
            f" still read its outputs: {named}{more}",
            "purge it once they have ended (or cancel them)",
        )
    return None
