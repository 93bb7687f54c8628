"""The pure decisions of bulk actions: scope checks, refusals and dry-run counts."""

import pytest

from shared.domain.actions import TaskAction
from shared.domain.errors import Conflict
from shared.domain.selectors import TaskSelector
from shared.domain.states import TERMINAL, JobState, TaskState
from shared.operations.bulk import (
    JOB_CANCELLED,
    JOB_PURGED,
    BulkRequest,
    Limits,
    MatchedTask,
    TooManyTasks,
    check_scope,
    dry_run_counts,
    refusal,
)

S = TaskState
LIMITS = Limits(max_tasks=1000, confirm_over=10, batch=5)


def _request(*, dry_run: bool = False, confirm: bool = False) -> BulkRequest:
    return BulkRequest(TaskSelector(job_name="*"), TaskAction.RECOVER, dry_run, confirm)


def _task(state: TaskState, job_cancelled: bool = False, job_purged: bool = False) -> MatchedTask:
    job_state = JobState.CANCELLED if job_cancelled else JobState.ACTIVE
    return MatchedTask(
        id="t-1", job_id="j-1", index=0, state=state, failure_class=None, host=None,
        job_state=job_state, job_purged=job_purged,
    )  # fmt: skip


@pytest.mark.parametrize("request_", [_request(), _request(dry_run=True), _request(confirm=True)])
def test_when_more_tasks_match_than_the_cap__it_is_refused_even_confirmed(
    request_: BulkRequest,
) -> None:
    with pytest.raises(TooManyTasks, match=r"more than 1000 tasks.*narrow it"):
        check_scope(1001, 3, request_, LIMITS)


def test_when_more_tasks_match_than_the_threshold__only_a_confirmed_or_dry_run_passes() -> None:
    with pytest.raises(Conflict) as refused:
        check_scope(11, 3, _request(), LIMITS)

    assert str(refused.value) == (
        'the selector matches 11 tasks in 3 jobs (more than 10); repeat with "confirm": true'
        " (`--yes`), or narrow the selector"
    )
    check_scope(11, 3, _request(confirm=True), LIMITS)
    check_scope(11, 3, _request(dry_run=True), LIMITS)
    check_scope(10, 3, _request(), LIMITS)
    check_scope(1000, 3, _request(confirm=True), LIMITS)


@pytest.mark.parametrize(
    ("action", "state", "expected"),
    [
        (TaskAction.RECOVER, S.FAILED_ON_CLUSTER, None),
        (TaskAction.RECOVER, S.COMPLETED, "not allowed in state completed"),
        (TaskAction.RESTART_CLUSTER, S.COMPLETED, None),
        (TaskAction.RESTART_CLUSTER, S.ON_CPU, "not allowed in state on_cpu"),
        (TaskAction.CANCEL, S.ON_CPU, None),
        (TaskAction.CANCEL, S.TERMINATED, "not allowed in state terminated"),
        (TaskAction.DUPLICATE, S.FAILED_TO_SETUP, None),
        (TaskAction.DUPLICATE, S.NEW, "not allowed in state new"),
        (TaskAction.HOLD, S.NEW, None),
        (TaskAction.RELEASE, S.NEW, "not allowed in state new"),
    ],
)
def test_when_a_state_does_not_allow_the_action__the_refusal_names_the_state(
    action: TaskAction, state: TaskState, expected: str | None
) -> None:
    assert refusal(action, _task(state)) == expected


@pytest.mark.parametrize("action", list(TaskAction))
def test_when_the_job_is_cancelled_or_purged__only_cancel_is_not_refused_for_it(
    action: TaskAction,
) -> None:
    state = S.ON_CPU if action is TaskAction.CANCEL else S.FAILED_ON_CLUSTER
    cancelled = refusal(action, _task(state, job_cancelled=True))
    purged = refusal(action, _task(state, job_cancelled=True, job_purged=True))

    if action is TaskAction.CANCEL:
        assert (cancelled, purged) == (None, None)
    else:
        assert (cancelled, purged) == (JOB_CANCELLED, JOB_PURGED)


def test_when_a_dry_run_is_counted__refusals_are_grouped_by_reason() -> None:
    matched = [
        _task(S.FAILED_ON_CLUSTER),
        _task(S.FAILED_TO_SETUP),
        _task(S.COMPLETED),
        _task(S.COMPLETED),
        _task(S.ON_CPU),
        _task(S.FAILED_ON_CLUSTER, job_cancelled=True),
    ]

    applied, refusals = dry_run_counts(matched, TaskAction.RECOVER)

    assert applied == 2
    assert refusals == {
        "not allowed in state completed": 2,
        "not allowed in state on_cpu": 1,
        JOB_CANCELLED: 1,
    }


def test_when_every_terminal_state_is_duplicated__none_is_refused() -> None:
    applied, refusals = dry_run_counts([_task(s) for s in TERMINAL], TaskAction.DUPLICATE)

    assert (applied, refusals) == (len(TERMINAL), {})
