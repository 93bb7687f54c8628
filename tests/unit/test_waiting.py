"""Why a task or a job waits: `shared.domain.waiting`, one branch a test,
in the order the decision takes them."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.domain.states import JobState, TaskState
from shared.domain.waiting import (
    ALL_REASONS,
    CONFIGURING_MESSAGE,
    PENDING_MESSAGE,
    Prerequisite,
    StoredWait,
    TaskFacts,
    Why,
    job_waiting,
    task_waiting,
)

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
WAITING = TaskFacts(state=TaskState.NEW, claimed=False)
ROW = StoredWait(
    "fair_share", "fair share: 3 tasks of other users ahead", {"ahead": 3}, NOW - timedelta(1)
)
UNMET = Prerequisite("t-up", "completed", TaskState.ON_CPU)


def _why(task: TaskFacts = WAITING, **given: Any) -> Why | None:
    facts: dict[str, Any] = {
        "job_state": JobState.ACTIVE,
        "stop_in_force": False,
        "prerequisites": [],
        "job_wait": None,
        "now": NOW,
    }
    return task_waiting(task, **(facts | given))


def _reason(task: TaskFacts = WAITING, **given: Any) -> str | None:
    why = _why(task, **given)
    return why.reason if why else None


def test_a_new_task_with_nothing_known_waits_for_the_schedulers_next_round() -> None:
    assert _why() == Why("pending", PENDING_MESSAGE, {})


def test_the_jobs_row_is_its_waiting_tasks_reason() -> None:
    assert _why(job_wait=ROW) == Why("fair_share", ROW.message, {"ahead": 3})


def test_an_emergency_stop_comes_before_anything_else_of_a_waiting_task() -> None:
    why = _why(
        stop_in_force=True,
        job_state=JobState.SUSPENDED,
        prerequisites=[UNMET],
        job_wait=ROW,
    )

    assert why is not None and why.reason == "emergency_stop"
    assert "emergency stop" in why.message


def test_a_suspended_jobs_task_says_so_before_its_prerequisites() -> None:
    why = _why(job_state=JobState.SUSPENDED, prerequisites=[UNMET], job_wait=ROW)

    assert why == Why("suspended", "the job is suspended", {})


def test_a_configuring_jobs_task_waits_for_activation_but_its_test_tasks_do_not() -> None:
    assert _why(job_state=JobState.CONFIGURING) == Why("configuring", CONFIGURING_MESSAGE, {})
    assert _reason(replace(WAITING, test=True), job_state=JobState.CONFIGURING) == "pending"


def test_an_unmet_setup_prerequisite_is_named_with_its_state() -> None:
    met = Prerequisite("t-done", "completed", TaskState.COMPLETED)
    other = Prerequisite("t-other", "queued", TaskState.NEW)

    why = _why(prerequisites=[met, UNMET, other], job_wait=ROW)

    assert why is not None and why.reason == "prerequisites"
    assert why.message == (
        "a prerequisite is not met yet: task t-up must reach completed (it is on_cpu); and 1 more"
    )
    assert why.detail == {"task_id": "t-up", "required": "completed", "state": "on_cpu", "unmet": 2}


def test_met_prerequisites_do_not_hold_a_task() -> None:
    met = [
        Prerequisite("t-a", "queued", TaskState.ON_CPU),
        Prerequisite("t-b", "failed", TaskState.FAILED_ON_CLUSTER, decided=True),
    ]

    assert _reason(prerequisites=met) == "pending"


def test_a_failed_prerequisite_is_met_only_once_the_triage_decided_it() -> None:
    undecided = Prerequisite("t-b", "failed", TaskState.FAILED_ON_CLUSTER, decided=False)

    assert _reason(prerequisites=[undecided]) == "prerequisites"


def test_a_resubmitted_task_waits_out_its_backoff_then_the_round() -> None:
    later = replace(WAITING, not_before=NOW + timedelta(seconds=30))
    past = replace(WAITING, not_before=NOW - timedelta(seconds=1))

    why = _why(later, job_wait=ROW)

    assert why is not None and why.reason == "backoff"
    assert why.message == "resubmitted: waits until 2026-11-27 12:00:30 UTC (its backoff)"
    assert why.detail == {"not_before": "2026-11-27T12:00:30+00:00"}
    assert _reason(past, job_wait=ROW) == "fair_share"


def test_a_placed_task_is_starting_on_its_host_whatever_else_holds() -> None:
    placed = replace(WAITING, claimed=True, host="h-1")

    why = _why(placed, stop_in_force=True, job_wait=ROW)

    assert why == Why("starting", "placed on host h-1, starting", {"host": "h-1"})


def test_a_held_task_is_held() -> None:
    why = _why(replace(WAITING, state=TaskState.ON_HOLD), job_wait=ROW)

    assert why is not None and why.reason == "held"


def test_a_queued_task_waits_for_its_turn_on_its_host() -> None:
    why = _why(TaskFacts(TaskState.QUEUED, claimed=False, host="h-2"))

    assert why == Why(
        "queued_on_host", "set up on host h-2, waiting for its turn there", {"host": "h-2"}
    )


@pytest.mark.parametrize(
    "state", [s for s in TaskState if s not in (TaskState.NEW, TaskState.ON_HOLD, TaskState.QUEUED)]
)
def test_a_task_in_any_other_state_is_not_waiting(state: TaskState) -> None:
    assert _why(TaskFacts(state, claimed=True, host="h-1"), job_wait=ROW) is None


def test_every_reason_given_is_one_the_api_documents() -> None:
    facts = [
        _why(),
        _why(job_wait=ROW),
        _why(stop_in_force=True),
        _why(job_state=JobState.SUSPENDED),
        _why(job_state=JobState.CONFIGURING),
        _why(prerequisites=[UNMET]),
        _why(replace(WAITING, not_before=NOW + timedelta(1))),
        _why(replace(WAITING, claimed=True)),
        _why(replace(WAITING, state=TaskState.ON_HOLD)),
        _why(replace(WAITING, state=TaskState.QUEUED)),
    ]

    assert {w.reason for w in facts if w} <= set(ALL_REASONS)
    assert len({w.reason for w in facts if w}) == len(facts)


# -- a job ----------------------------------------------------------------------------------


def test_a_job_without_waiting_tasks_is_not_waiting() -> None:
    waiting = job_waiting(
        job_state=JobState.ACTIVE, stop_in_force=True, waiting_tasks=0, job_wait=ROW
    )

    assert waiting is None


def test_a_jobs_waiting_tasks_have_its_row_and_their_count() -> None:
    waiting = job_waiting(
        job_state=JobState.ACTIVE, stop_in_force=False, waiting_tasks=7, job_wait=ROW
    )

    assert waiting is not None and (waiting.why, waiting.tasks) == (ROW.why(), 7)


def test_a_stop_then_a_suspension_come_before_the_jobs_row() -> None:
    stopped = job_waiting(
        job_state=JobState.SUSPENDED, stop_in_force=True, waiting_tasks=1, job_wait=ROW
    )
    suspended = job_waiting(
        job_state=JobState.SUSPENDED, stop_in_force=False, waiting_tasks=1, job_wait=ROW
    )

    assert stopped is not None and stopped.why.reason == "emergency_stop"
    assert suspended is not None and suspended.why.reason == "suspended"


def test_without_a_row_a_job_waits_for_the_round_or_says_its_tasks_may_wait_on_prerequisites() -> (
    None
):
    plain = job_waiting(
        job_state=JobState.ACTIVE, stop_in_force=False, waiting_tasks=2, job_wait=None
    )
    chained = job_waiting(
        job_state=JobState.ACTIVE,
        stop_in_force=False,
        waiting_tasks=2,
        job_wait=None,
        has_prerequisites=True,
    )

    assert plain is not None and plain.why == Why("pending", PENDING_MESSAGE, {})
    assert chained is not None and chained.why.reason == "pending"
    assert "prerequisites" in chained.why.message
