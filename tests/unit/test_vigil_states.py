"""The client's copies of the state sets equal the server's (the client imports no server code)."""

from shared.domain import states
from shared.domain.actions import TaskAction
from shared.domain.messages import Severity
from vigil import cli
from vigil import states as client_states


def test_the_client_final_job_states_are_the_servers() -> None:
    server = {states.JobState.COMPLETED, states.JobState.FAILED, states.JobState.CANCELLED}

    assert {s.value for s in server} == client_states.JOB_FINAL
    assert {s.value for s in states.JobState} >= client_states.JOB_FINAL


def test_the_client_task_state_sets_are_the_servers() -> None:
    assert {s.value for s in states.FAILED} == client_states.TASK_FAILED
    assert {s.value for s in states.TERMINAL} == client_states.TASK_TERMINAL
    assert {s.value for s in states.TaskState} == client_states.TASK_STATES


def test_when_counting_progress__only_resting_tasks_are_done() -> None:
    counts = {"completed": 3, "failed_on_cluster": 1, "terminated": 1, "on_cpu": 2, "new": 3}

    assert client_states.done_and_total(counts) == (5, 10)


def test_the_cli_choices_are_the_servers_values() -> None:
    assert {s.value for s in cli.JobState} == {s.value for s in states.JobState}
    assert [s.value for s in cli.Severity] == [s.value for s in Severity]
    assert {f"restart_{s.value}" for s in cli.RestartStage} == {
        a.value for a in TaskAction if a.value.startswith("restart_")
    }
