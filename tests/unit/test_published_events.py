"""What each published outbox row tells the scheduler (`Scheduler._on_published`)."""

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from services.scheduler.due import Due, Pace
from services.scheduler.main import Scheduler
from shared.store import activity
from shared.store.outbox import ExchangeKind, OutboxRow


@dataclass
class _Finaliser:
    touched: list[str] = field(default_factory=list)
    cancelled_jobs: list[str] = field(default_factory=list)

    def touch(self, job_id: str) -> None:
        self.touched.append(job_id)

    def cancelled(self, job_id: str) -> None:
        self.cancelled_jobs.append(job_id)


def _told(
    key: str, *, waiting: bool = True, exchange: ExchangeKind = "events", slowed: bool = False
) -> Any:
    """The scheduler's parts after `key` was published, with whether the round was woken."""
    dues = [Due(every_s=2.0) for _ in range(3)]
    for due in dues:  # take each first look, so that only a tell makes another due
        due.due(0.0)
        due.ran(False, 0.0)
    pace = Pace(0.05, 1.0)
    pace.idle_wait(0.0)  # a round that found nothing: not slowed yet
    if slowed:
        pace.idle_wait(0.1)  # a second: the round sleeps longer now
    scheduler = SimpleNamespace(
        tally=activity.Tally(),
        pace=pace,
        triage_due=dues[0],
        release_due=dues[1],
        waiters_due=dues[2],
        waiting=waiting,
        finaliser=_Finaliser(),
    )
    wake = asyncio.Event()
    row = OutboxRow(1, exchange, key, b'{"failure_class": "cluster"}', datetime.now(UTC), 7)
    Scheduler._on_published(scheduler, row, wake)  # type: ignore[arg-type]
    return SimpleNamespace(
        woken=wake.is_set(),
        triage=dues[0].due(0.1),
        release=dues[1].due(0.1),
        waiters=dues[2].due(0.1),
        touched=scheduler.finaliser.touched,
        cancelled=scheduler.finaliser.cancelled_jobs,
        counted=dict(scheduler.tally.counts),
    )


def test_a_failure_tells_the_triage_and_wakes_the_round() -> None:
    told = _told("task.failed_on_cluster.j-1")
    assert (told.woken, told.triage, told.release, told.touched) == (True, True, False, [])
    assert any(kind == "failed:cluster" for _, _, kind in told.counted)


@pytest.mark.parametrize("verdict", ["recovered", "resubmitted", "abandoned"])
def test_a_decision_tells_the_finaliser_its_job_and_what_waits(verdict: str) -> None:
    told = _told(f"task.{verdict}.j-2")
    assert (told.woken, told.triage, told.touched) == (True, False, ["j-2"])
    assert (told.release, told.waiters) == (True, True)
    assert told.counted == {}  # a decision is not a state


def test_a_decision_with_nothing_waiting_tells_only_the_finaliser() -> None:
    told = _told("task.resubmitted.j-3", waiting=False)
    assert (told.touched, told.release, told.waiters) == (["j-3"], False, False)


def test_a_cancelled_job_has_its_keys_purged() -> None:
    told = _told("job.cancelled.j-4")
    assert (told.woken, told.cancelled, told.touched) == (True, ["j-4"], [])


@pytest.mark.parametrize(
    "key", ["task.queued.j-5", "task.completed.j-5", "job.succeeded.j-5", "host.quarantined.h1"]
)
def test_what_acts_on_nothing_wakes_nothing(key: str) -> None:
    told = _told(key)
    assert (told.woken, told.triage, told.release, told.touched, told.cancelled) == (
        False,
        False,
        False,
        [],
        [],
    )


def test_while_the_round_sleeps_long_any_event_wakes_it() -> None:
    assert _told("task.queued.j-6", slowed=True).woken


def test_a_work_message_is_not_an_event() -> None:
    told = _told("host.h1", exchange="work")
    assert (told.woken, told.counted) == (False, {})
