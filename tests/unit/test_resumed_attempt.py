"""Which held task a worker that lost track of it may drive again, and from which attempt
(`services.worker.claims.resumed_attempt`): only where nothing after its take had started."""

import pytest

from services.worker.claims import resumed_attempt
from shared.domain.states import ACTIONS, TaskState

S = TaskState
RUNNING_HOOKS = [running for running, _ok, _failed in ACTIONS.values()]


@pytest.mark.parametrize("state", [S.QUEUED, S.DATA_READY, *RUNNING_HOOKS])
def test_a_resting_task_or_a_hook_not_begun_is_driven_again_when_no_attempt_is_open(
    state: TaskState,
) -> None:
    assert resumed_attempt(state, [], 3) == (True, None)
    # a hook's attempt open: it had begun
    assert resumed_attempt(state, [(3, "recover_from_cluster_failure")], 3) == (False, None)


def test_a_setup_carries_on_with_its_takes_attempt_or_opens_one() -> None:
    assert resumed_attempt(S.SETTING_UP, [(4, "setup")], 4) == (True, 4)
    assert resumed_attempt(S.SETTING_UP, [], 4) == (True, None)  # a general take opens none
    assert resumed_attempt(S.SETTING_UP, [(3, "setup")], 4) == (False, None)  # not the latest
    assert resumed_attempt(S.SETTING_UP, [(3, "setup"), (4, "setup")], 4) == (False, None)


def test_post_processing_carries_on_with_its_open_attempt_only() -> None:
    assert resumed_attempt(S.POST_PROCESSING, [(5, "post_processing")], 5) == (True, 5)
    assert resumed_attempt(S.POST_PROCESSING, [], 5) == (False, None)


RESUMABLE = {S.SETTING_UP, S.QUEUED, S.DATA_READY, S.POST_PROCESSING, *RUNNING_HOOKS}


@pytest.mark.parametrize("state", [s for s in TaskState if s not in RESUMABLE])
def test_a_command_that_may_have_run_is_never_run_again(state: TaskState) -> None:
    assert resumed_attempt(state, [], 2) == (False, None)
    assert resumed_attempt(state, [(2, "cluster")], 2) == (False, None)
