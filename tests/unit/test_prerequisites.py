"""Prerequisite evaluation (design §4): met, and no longer meetable, for every state."""

import pytest

from shared.domain.prerequisites import MET, UNMEETABLE, Required, is_met, unmet_sql
from shared.domain.states import FAILED, TaskState

S = TaskState
LATER_THAN_QUEUED = {S.QUEUED, S.ON_CPU, S.DATA_READY, S.POST_PROCESSING, S.COMPLETED}

EXPECTED_MET = {
    Required.QUEUED: LATER_THAN_QUEUED,
    Required.DATA_READY: {S.DATA_READY, S.POST_PROCESSING, S.COMPLETED},
    Required.COMPLETED: {S.COMPLETED},
    Required.FAILED: set(FAILED),
}


@pytest.mark.parametrize("other", list(TaskState))
@pytest.mark.parametrize("required", list(Required))
def test_a_requirement_is_met_exactly_in_its_states(required: Required, other: TaskState) -> None:
    assert is_met(required, other) == (other in EXPECTED_MET[required])


@pytest.mark.parametrize("required", list(Required))
def test_a_requirement_is_never_both_met_and_out_of_reach(required: Required) -> None:
    assert not (MET[required] & UNMEETABLE[required])


def test_a_failed_or_terminated_task_can_no_longer_reach_a_normal_state() -> None:
    for required in (Required.QUEUED, Required.DATA_READY, Required.COMPLETED):
        assert UNMEETABLE[required] == FAILED | {S.TERMINATED}
    assert UNMEETABLE[Required.FAILED] == {S.COMPLETED, S.TERMINATED}


def test_unmet_sql_names_its_stage_and_refuses_others() -> None:
    assert "p.stage = 'setup'" in unmet_sql("setup")
    assert "$2::task_state[]" in unmet_sql("setup") and "$5::task_state[]" in unmet_sql("setup")
    with pytest.raises(ValueError, match="no prerequisites"):
        unmet_sql("cluster")
