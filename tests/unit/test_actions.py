"""The action table: every (action, state) pair is planned or refused with the allowed states."""

import pytest

from shared.domain.actions import TaskAction, allowed_states, plan
from shared.domain.errors import Conflict
from shared.domain.states import TERMINAL, TaskState

S = TaskState

EXPECTED: dict[TaskAction, dict[TaskState, TaskState | None]] = {
    TaskAction.RECOVER: {
        S.FAILED_SETUP_PREREQUISITES: S.NEW,
        S.FAILED_POST_PROCESSING_PREREQUISITES: S.DATA_READY,
        S.FAILED_TO_SETUP: S.RECOVER_SETUP,
        S.FAILED_ON_CLUSTER: S.RECOVER_CLUSTER,
        S.FAILED_TO_POST_PROCESS: S.RECOVER_POST_PROCESSING,
    },
    TaskAction.RESTART_SETUP: {S.COMPLETED: S.RESTART_SETUP},
    TaskAction.RESTART_CLUSTER: {S.COMPLETED: S.RESTART_CLUSTER},
    TaskAction.RESTART_POST_PROCESSING: {S.COMPLETED: S.RESTART_POST_PROCESSING},
    TaskAction.HOLD: {S.NEW: S.ON_HOLD},
    TaskAction.RELEASE: {S.ON_HOLD: S.NEW},
    TaskAction.DUPLICATE: dict.fromkeys(TERMINAL),
    TaskAction.CANCEL: dict.fromkeys(set(TaskState) - TERMINAL, S.TERMINATED),
}
HOOKED = {S.RECOVER_SETUP, S.RECOVER_CLUSTER, S.RECOVER_POST_PROCESSING,
          S.RESTART_SETUP, S.RESTART_CLUSTER, S.RESTART_POST_PROCESSING}  # fmt: skip


@pytest.mark.parametrize("state", list(TaskState))
@pytest.mark.parametrize("action", list(TaskAction))
def test_every_action_in_every_state_is_planned_or_refused(
    action: TaskAction, state: TaskState
) -> None:
    table = EXPECTED[action]
    if state not in table:
        with pytest.raises(Conflict) as refused:
            plan(action, state)
        assert f"state {state.value}" in str(refused.value)
        assert all(s.value in str(refused.value) for s in table)
        return
    step = plan(action, state)
    assert step.target == table[state]
    assert step.duplicate == (action is TaskAction.DUPLICATE)
    assert step.hook == (table[state] in HOOKED)


@pytest.mark.parametrize("action", list(TaskAction))
def test_allowed_states_are_the_table_rows(action: TaskAction) -> None:
    assert set(allowed_states(action)) == set(EXPECTED[action])
