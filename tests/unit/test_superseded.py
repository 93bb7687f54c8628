"""A superseded task is history, not work: the pure parts. A global fix refuses it,
the dashboard offers it nothing that runs, and `vigil status` shows it apart from what is
wrong, with its clone and the triage's decision."""

from typing import Any

import pytest
from rich.console import Console

from services.api import dashboard
from shared.domain.actions import SUPERSEDED, TaskAction, runs_again
from shared.domain.states import FailureClass, JobState, TaskState
from shared.operations.bulk import MatchedTask, refusal
from vigil import render

ORIGINAL: dict[str, Any] = {
    "id": "t-original",
    "index": 1,
    "state": "failed_on_cluster",
    "failure_class": "signal",
    "error_brief": "killed by SIGKILL",
    "superseded_by": "t-clone",
    "decision": "resubmitted",
    "decision_reason": "signal: resubmitted (1/3) after 0.1s",
}
CLONE: dict[str, Any] = {
    "id": "t-clone",
    "index": 1,
    "state": "completed",
    "resubmitted_from": "t-original",
    "superseded_by": None,
}
FAILED: dict[str, Any] = {
    "id": "t-failed",
    "index": 2,
    "state": "failed_on_cluster",
    "failure_class": "exit",
    "error_brief": "command exited with code 3",
    "superseded_by": None,
}


def _shown(*parts: Any) -> str:
    console = Console(width=300, record=True)
    for part in parts:
        console.print(part)
    return console.export_text()


def _rows(shown: str) -> dict[str, str]:
    """Each line of `shown` by its first word: the rest, its spaces squeezed."""
    words = [line.split() for line in shown.splitlines() if line.strip()]
    return {w[0]: " ".join(w[1:]) for w in words}


def _matched(state: TaskState, superseded_by: str | None) -> MatchedTask:
    return MatchedTask(
        id="t-1",
        job_id="j-1",
        index=0,
        state=state,
        failure_class=FailureClass.SIGNAL,
        host=None,
        job_state=JobState.COMPLETED,
        job_purged=False,
        superseded_by=superseded_by,
    )


@pytest.mark.parametrize("action", list(TaskAction))
def test_a_global_fix_refuses_every_action_but_cancel_on_a_superseded_task(
    action: TaskAction,
) -> None:
    superseded = refusal(action, _matched(TaskState.FAILED_ON_CLUSTER, "t-clone"))
    if action is TaskAction.CANCEL:
        assert superseded == "not allowed in state failed_on_cluster"  # the state table's
    else:
        assert superseded == SUPERSEDED
    assert runs_again(action) is (action is not TaskAction.CANCEL)


def test_a_global_fix_still_recovers_a_failed_task_that_is_the_last_of_its_input() -> None:
    assert refusal(TaskAction.RECOVER, _matched(TaskState.FAILED_ON_CLUSTER, None)) is None


def test_the_dashboard_offers_a_superseded_task_nothing_that_runs_it_again() -> None:
    assert dashboard.task_actions(TaskState.FAILED_ON_CLUSTER) == ["recover", "duplicate"]
    assert dashboard.task_actions(TaskState.FAILED_ON_CLUSTER, superseded=True) == []
    assert dashboard.task_actions(TaskState.ON_CPU, superseded=True) == ["cancel"]


def test_status_of_a_job_lists_as_failed_only_the_last_task_of_each_input() -> None:
    tasks = [ORIGINAL, CLONE, FAILED]
    job = {"id": "j-1", "state": "failed", "counts": {"completed": 1, "failed_on_cluster": 1}}

    shown = _shown(
        *render.job_detail(job | {"superseded": 1}, render.failing(tasks), render.superseded(tasks))
    )

    failed_part, history = shown.split("failed tasks", 1)[1].split("resubmitted tasks", 1)
    assert "t-failed" in failed_part and "t-original" not in failed_part
    assert "t-original" in history and "t-clone" in history
    assert "resubmitted: signal: resubmitted (1/3) after 0.1s" in history
    assert _rows(shown.split("\n\n")[0])["resubmitted"] == (
        "1 task(s), each superseded by its clone (not counted below)"
    )


def test_status_of_a_superseded_task_shows_its_clone_and_the_decision() -> None:
    attempt = {
        "attempt": 1,
        "run_number": 1,
        "stage": "cluster",
        "outcome": "failed_on_cluster",
        "decision": "resubmitted",
        "decision_reason": "signal: resubmitted (1/3) after 0.1s",
    }

    shown = _shown(*render.task_detail(ORIGINAL | {"attempts": [attempt]}))

    rows = _rows(shown)
    assert rows["superseded_by"] == "t-clone (its clone carries the input on; this task is history)"
    assert rows["decision"] == "resubmitted: signal: resubmitted (1/3) after 0.1s"
    assert rows["ATTEMPT"].endswith("DECISION")
    assert rows["1"].endswith("resubmitted: signal: resubmitted (1/3) after 0.1s")
    clone = _rows(_shown(*render.task_detail(CLONE | {"attempts": []})))
    assert clone["resubmitted_from"] == "t-original" and "superseded_by" not in clone
