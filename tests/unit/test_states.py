"""The task and job transition tables against an expected table written out from design §2.

The expected pairs below are typed in by hand from the design, not derived from
`shared.domain.states.TRANSITIONS`, so that a change to the table has to be a change to this file
too.
"""

import itertools

import pytest

from shared.domain.errors import InvalidTransition
from shared.domain.states import (
    HELD_BY_WORKER,
    JOB_TRANSITIONS,
    NORMAL_PATH,
    TERMINAL,
    TRANSITIONS,
    JobState,
    TaskState,
    allowed,
    check_transition,
    failure_state_for,
    job_outcome,
    job_sources_for,
    sources_for,
)

S = TaskState

NORMAL: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (S.NEW, S.SETTING_UP),
        (S.SETTING_UP, S.QUEUED),
        (S.QUEUED, S.ON_CPU),
        (S.ON_CPU, S.DATA_READY),
        (S.DATA_READY, S.POST_PROCESSING),
        (S.POST_PROCESSING, S.COMPLETED),
    }
)

FAILURE_TRIGGERS: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (S.SETTING_UP, S.FAILED_TO_SETUP),  # setup() raised or returned False
        (S.ON_CPU, S.FAILED_ON_CLUSTER),  # exit, signal, lost, hung, walltime, error log
        (S.POST_PROCESSING, S.FAILED_ON_CLUSTER),  # save_results() returned False
        (S.POST_PROCESSING, S.FAILED_TO_POST_PROCESS),  # save_results() raised
        (S.NEW, S.FAILED_SETUP_PREREQUISITES),
        (S.DATA_READY, S.FAILED_POST_PROCESSING_PREREQUISITES),
        # A queued or data_ready task has its work dir on one host: losing that host fails it.
        (S.QUEUED, S.FAILED_ON_CLUSTER),
        (S.DATA_READY, S.FAILED_ON_CLUSTER),
    }
)

# (allowed current state, action state, state while the hook runs, on True, on False/exception)
RECOVERY_AND_RESTART_ROWS: tuple[
    tuple[TaskState, TaskState, TaskState, TaskState, TaskState], ...
] = (
    (S.FAILED_TO_SETUP, S.RECOVER_SETUP, S.RECOVERING_SETUP, S.NEW, S.FAILED_TO_SETUP),
    (S.FAILED_ON_CLUSTER, S.RECOVER_CLUSTER, S.RECOVERING_CLUSTER, S.QUEUED, S.FAILED_ON_CLUSTER),
    (
        S.FAILED_TO_POST_PROCESS,
        S.RECOVER_POST_PROCESSING,
        S.RECOVERING_POST_PROCESSING,
        S.DATA_READY,
        S.FAILED_TO_POST_PROCESS,
    ),
    (S.COMPLETED, S.RESTART_SETUP, S.RESTARTING_SETUP, S.NEW, S.COMPLETED),
    (S.COMPLETED, S.RESTART_CLUSTER, S.RESTARTING_CLUSTER, S.QUEUED, S.COMPLETED),
    (
        S.COMPLETED,
        S.RESTART_POST_PROCESSING,
        S.RESTARTING_POST_PROCESSING,
        S.DATA_READY,
        S.COMPLETED,
    ),
)

ACTION_ROWS: frozenset[tuple[TaskState, TaskState]] = frozenset(
    pair
    for current, action, running, on_true, on_false in RECOVERY_AND_RESTART_ROWS
    for pair in (
        (current, action),
        (action, running),
        (running, on_true),
        (running, on_false),
        # An action that was asked but not started yet can be withdrawn to where it came from.
        (action, current),
    )
)

RECOVER_WITHOUT_HOOK: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (S.FAILED_SETUP_PREREQUISITES, S.NEW),
        (S.FAILED_POST_PROCESSING_PREREQUISITES, S.DATA_READY),
    }
)

HOLD: frozenset[tuple[TaskState, TaskState]] = frozenset({(S.NEW, S.ON_HOLD), (S.ON_HOLD, S.NEW)})

FAILED_STATES: frozenset[TaskState] = frozenset(
    {
        S.FAILED_TO_SETUP,
        S.FAILED_ON_CLUSTER,
        S.FAILED_TO_POST_PROCESS,
        S.FAILED_SETUP_PREREQUISITES,
        S.FAILED_POST_PROCESSING_PREREQUISITES,
    }
)

ACTION_STATES: frozenset[TaskState] = frozenset(
    state for row in RECOVERY_AND_RESTART_ROWS for state in (row[1], row[2])
)

# A user or the system can stop a task wherever it is short of finished (hooks included, as
# `setting_up` is), and an operator can give up on a failed one; a completed task stays completed.
TERMINATED_FROM: frozenset[TaskState] = (
    frozenset({S.NEW, S.ON_HOLD, S.SETTING_UP, S.QUEUED, S.ON_CPU, S.DATA_READY, S.POST_PROCESSING})
    | ACTION_STATES
    | FAILED_STATES
)

EXPECTED: frozenset[tuple[TaskState, TaskState]] = (
    NORMAL
    | FAILURE_TRIGGERS
    | ACTION_ROWS
    | RECOVER_WITHOUT_HOOK
    | HOLD
    | {(src, S.TERMINATED) for src in TERMINATED_FROM}
)

ALL_PAIRS = list(itertools.product(TaskState, TaskState))


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=[f"{s}->{d}" for s, d in ALL_PAIRS])
def test_when_checking_any_pair__only_the_expected_table_is_accepted(
    src: TaskState, dst: TaskState
) -> None:
    if (src, dst) in EXPECTED:
        check_transition(src, dst)
        assert allowed(src, dst)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(src, dst)
        assert not allowed(src, dst)


def test_when_listing_the_table__every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(TaskState)


def test_when_a_task_is_terminated__nothing_leaves_terminated() -> None:
    assert TRANSITIONS[S.TERMINATED] == frozenset()


def test_when_walking_the_normal_path__each_step_is_allowed() -> None:
    assert NORMAL_PATH == (
        S.NEW,
        S.SETTING_UP,
        S.QUEUED,
        S.ON_CPU,
        S.DATA_READY,
        S.POST_PROCESSING,
        S.COMPLETED,
    )
    for src, dst in itertools.pairwise(NORMAL_PATH):
        check_transition(src, dst)


def test_when_a_transition_is_refused__the_error_names_both_states() -> None:
    with pytest.raises(InvalidTransition, match=r"completed.*new"):
        check_transition(S.COMPLETED, S.NEW)


@pytest.mark.parametrize("dst", list(TaskState), ids=str)
def test_when_asking_sources_for_a_state__they_are_the_expected_sources_sorted(
    dst: TaskState,
) -> None:
    expected = sorted(src for src, d in EXPECTED if d == dst)
    assert expected, f"the expected table has no way into {dst}"
    assert sources_for(dst) == expected


def test_when_sources_are_narrowed__only_those_among_remain() -> None:
    found = sources_for(S.FAILED_ON_CLUSTER, among=HELD_BY_WORKER)
    assert found == [S.ON_CPU, S.POST_PROCESSING, S.RECOVERING_CLUSTER]


def test_when_no_source_remains_after_narrowing__invalid_transition_is_raised() -> None:
    with pytest.raises(InvalidTransition):
        sources_for(S.ON_CPU, among=frozenset({S.NEW, S.COMPLETED}))


EXPECTED_FAILURE_STATE: dict[TaskState, TaskState] = {
    S.SETTING_UP: S.FAILED_TO_SETUP,
    S.QUEUED: S.FAILED_ON_CLUSTER,
    S.ON_CPU: S.FAILED_ON_CLUSTER,
    S.DATA_READY: S.FAILED_ON_CLUSTER,
    S.POST_PROCESSING: S.FAILED_ON_CLUSTER,
    S.RECOVER_SETUP: S.FAILED_TO_SETUP,
    S.RECOVERING_SETUP: S.FAILED_TO_SETUP,
    S.RECOVER_CLUSTER: S.FAILED_ON_CLUSTER,
    S.RECOVERING_CLUSTER: S.FAILED_ON_CLUSTER,
    S.RECOVER_POST_PROCESSING: S.FAILED_TO_POST_PROCESS,
    S.RECOVERING_POST_PROCESSING: S.FAILED_TO_POST_PROCESS,
    S.RESTART_SETUP: S.COMPLETED,
    S.RESTARTING_SETUP: S.COMPLETED,
    S.RESTART_CLUSTER: S.COMPLETED,
    S.RESTARTING_CLUSTER: S.COMPLETED,
    S.RESTART_POST_PROCESSING: S.COMPLETED,
    S.RESTARTING_POST_PROCESSING: S.COMPLETED,
}


@pytest.mark.parametrize("state", sorted(EXPECTED_FAILURE_STATE), ids=str)
def test_when_a_worker_is_lost_in_a_state__the_task_fails_to_the_expected_allowed_state(
    state: TaskState,
) -> None:
    failed = failure_state_for(state)
    assert failed == EXPECTED_FAILURE_STATE[state]
    assert (state, failed) in EXPECTED


def test_when_listing_held_states__every_one_has_a_failure_state() -> None:
    assert set(HELD_BY_WORKER) <= set(EXPECTED_FAILURE_STATE)
    expected_held = frozenset(
        {
            S.SETTING_UP,
            S.ON_CPU,
            S.POST_PROCESSING,
            S.RECOVERING_SETUP,
            S.RECOVERING_CLUSTER,
            S.RECOVERING_POST_PROCESSING,
            S.RESTARTING_SETUP,
            S.RESTARTING_CLUSTER,
            S.RESTARTING_POST_PROCESSING,
        }
    )
    assert expected_held == HELD_BY_WORKER


@pytest.mark.parametrize("state", sorted(set(TaskState) - set(EXPECTED_FAILURE_STATE)), ids=str)
def test_when_no_worker_can_hold_the_state__failure_state_for_raises(state: TaskState) -> None:
    with pytest.raises(InvalidTransition):
        failure_state_for(state)


def test_when_listing_terminal_states__they_are_the_failed_ones_completed_and_terminated() -> None:
    assert FAILED_STATES | {S.COMPLETED, S.TERMINATED} == TERMINAL


@pytest.mark.parametrize(
    ("counts", "outcome"),
    [
        ({}, None),
        ({S.COMPLETED: 0}, None),
        ({S.COMPLETED: 3}, JobState.COMPLETED),
        ({S.COMPLETED: 3, S.NEW: 0}, JobState.COMPLETED),
        ({S.COMPLETED: 2, S.ON_CPU: 1}, None),
        ({S.COMPLETED: 2, S.RECOVER_CLUSTER: 1}, None),
        ({S.COMPLETED: 2, S.FAILED_ON_CLUSTER: 1}, JobState.FAILED),
        ({S.TERMINATED: 2}, JobState.FAILED),
        ({S.FAILED_SETUP_PREREQUISITES: 1, S.FAILED_TO_POST_PROCESS: 1}, JobState.FAILED),
        ({S.FAILED_TO_SETUP: 1, S.NEW: 1}, None),
    ],
    ids=[
        "no-task",
        "zero-count",
        "all-completed",
        "all-completed-with-zero-new",
        "one-running",
        "one-recovery-asked",
        "one-failed",
        "all-terminated",
        "all-failed",
        "failed-and-new",
    ],
)
def test_when_a_job_has_task_counts__its_outcome_follows(
    counts: dict[TaskState, int], outcome: JobState | None
) -> None:
    assert job_outcome(counts) == outcome


J = JobState
EXPECTED_JOB: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        # A configuring job is activated, or given up.
        (J.CONFIGURING, J.ACTIVE),
        (J.CONFIGURING, J.CANCELLED),
        (J.ACTIVE, J.SUSPENDED),
        (J.ACTIVE, J.COMPLETED),
        (J.ACTIVE, J.FAILED),
        (J.ACTIVE, J.CANCELLED),
        (J.SUSPENDED, J.ACTIVE),
        (J.SUSPENDED, J.CANCELLED),
        # A finished job becomes active again when inputs are appended or a task recovered.
        (J.COMPLETED, J.ACTIVE),
        (J.FAILED, J.ACTIVE),
    }
)
ALL_JOB_PAIRS = list(itertools.product(JobState, JobState))


@pytest.mark.parametrize(("src", "dst"), ALL_JOB_PAIRS, ids=[f"{s}->{d}" for s, d in ALL_JOB_PAIRS])
def test_when_checking_any_job_pair__only_the_expected_job_table_is_accepted(
    src: JobState, dst: JobState
) -> None:
    assert (dst in JOB_TRANSITIONS[src]) == ((src, dst) in EXPECTED_JOB)


@pytest.mark.parametrize("dst", list(JobState), ids=str)
def test_when_asking_job_sources__they_are_the_expected_sources_sorted(dst: JobState) -> None:
    expected = sorted(src for src, d in EXPECTED_JOB if d == dst)
    if expected:
        assert job_sources_for(dst) == expected
    else:
        with pytest.raises(InvalidTransition):
            job_sources_for(dst)
