"""Pure parts of the dashboard and the SSE format: what is offered, how it is ordered, framing."""

import dataclasses
import json
from datetime import UTC, datetime, timedelta

from services.api import dashboard
from services.api.sse import KEEPALIVE, OPENED, frame
from services.api.templates import Pages, duration
from shared.domain.actions import TaskAction, plan
from shared.domain.errors import Conflict
from shared.domain.states import JobState, TaskState
from shared.store.jobs_repo import Job


def _job(state: JobState, counts: dict[str, int]) -> Job:
    now = datetime.now(UTC)
    return Job(
        id="j-1",
        owner_id="u-1",
        name="n",
        type="shell",
        command="true",
        outputs=[],
        params={},
        policy={},
        prerequisites={},
        inputs_from=None,
        state=state,
        max_in_flight=10,
        release_per_tick=10,
        created_at=now,
        finished_at=None,
        counts=counts,
    )


def test_the_task_actions_offered_are_exactly_those_the_api_accepts() -> None:
    for state in TaskState:
        offered = set(dashboard.task_actions(state))
        for action in TaskAction:
            try:
                plan(action, state)
                accepted = True
            except Conflict:
                accepted = False
            assert (action.value in offered) == accepted, (state, action)


def test_job_actions_follow_the_job_state_and_failed_tasks() -> None:
    assert dashboard.job_actions(_job(JobState.ACTIVE, {"on_cpu": 1})) == ["suspend", "cancel"]
    assert dashboard.job_actions(_job(JobState.SUSPENDED, {})) == ["resume", "cancel"]
    assert dashboard.job_actions(_job(JobState.CONFIGURING, {})) == ["activate", "cancel"]
    assert dashboard.job_actions(_job(JobState.FAILED, {"failed_on_cluster": 2})) == [
        "purge",
        "recover_failed",
    ]
    assert dashboard.job_actions(_job(JobState.COMPLETED, {"completed": 3})) == ["purge"]
    assert dashboard.job_actions(_job(JobState.CANCELLED, {"failed_to_setup": 1})) == ["purge"]
    purged = dataclasses.replace(_job(JobState.COMPLETED, {}), purged_at=datetime.now(UTC))
    assert dashboard.job_actions(purged) == []  # nothing left to purge


def test_counts_come_in_lifecycle_order() -> None:
    counts = {"completed": 1, "new": 2, "failed_on_cluster": 3, "on_cpu": 4}
    assert [s for s, _ in dashboard.ordered_counts(counts)] == [
        "new",
        "on_cpu",
        "completed",
        "failed_on_cluster",
    ]


def test_inputs_are_shortened_to_one_line() -> None:
    assert dashboard.short_input("a\nb   c") == "a b c"
    assert dashboard.short_input({"k": [1, 2]}) == '{"k": [1, 2]}'
    assert len(dashboard.short_input("x" * 500)) == 80


def test_an_sse_frame_is_one_data_line_whatever_the_body() -> None:
    body = json.dumps({"line": "a\nb\r\nc\u2028d"}).encode()
    out = frame("log.info.j-1", body)
    assert out.startswith(b"data: ") and out.endswith(b"\n\n")
    assert out.count(b"\n") == 2 and b"\r" not in out
    assert json.loads(out[6:]) == {
        "routing_key": "log.info.j-1",
        "body": {"line": "a\nb\r\nc\u2028d"},
    }
    assert json.loads(frame("k", b"\xff not json")[6:])["body"] == "\ufffd not json"
    assert KEEPALIVE == b": keepalive\n\n" and OPENED.startswith(b":")


def test_templates_escape_every_value() -> None:
    pages = Pages()
    response = pages.render(
        "error.html",
        user=None,
        page="error",
        page_data={"x": "</script><b>"},
        title="<i>t",
        message="<b>m",
    )
    text = bytes(response.body).decode()
    assert "&lt;i&gt;t" in text and "&lt;b&gt;m" in text
    assert "</script><b>" not in text
    assert response.headers["content-security-policy"].startswith("default-src 'none'")


def test_a_jobs_progress_is_its_tasks_at_rest_out_of_all_and_its_time_runs_to_its_end() -> None:
    job = _job(JobState.ACTIVE, {"completed": 3, "failed_on_cluster": 1, "on_cpu": 2, "new": 4})
    ended = dataclasses.replace(job, finished_at=job.created_at + timedelta(seconds=75))

    assert dashboard.progress(job.counts) == (4, 10)
    assert dashboard.elapsed_s(job, job.created_at + timedelta(hours=2)) == 7200
    assert dashboard.elapsed_s(ended, job.created_at + timedelta(hours=2)) == 75


def test_durations_are_shown_as_squeue_shows_them() -> None:
    shown = [duration(s) for s in (None, 0.4, 75, 3600, 93_784.9)]

    assert shown == ["", "0:00", "1:15", "1:00:00", "1-02:03:04"]


def test_a_pilots_remaining_walltime_is_said_in_seconds_minutes_or_hours() -> None:
    shown = [dashboard.walltime_left(s) for s in (None, -3, 0, 40.7, 119.9, 450, 7199, 7530)]

    assert shown == [
        "",
        "walltime over",
        "walltime over",
        "40 s left",
        "119 s left",
        "7 min left",
        "119 min left",
        "2 h 05 min left",
    ]
