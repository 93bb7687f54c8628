"""A task event's body made by hand (`messages.task_event_body`) is the model's own."""

from datetime import UTC, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.domain.messages import TaskEvent, task_event_body, to_jsonable
from shared.domain.states import FailureClass, TaskState

_TEXT = st.text(max_size=40)
_ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5, minutes=30))]
)
_FIELDS = st.fixed_dictionaries(
    {
        "job_id": _TEXT,
        "task_id": _TEXT,
        "state": st.sampled_from(TaskState),
        "previous": st.none() | st.sampled_from(TaskState),
        "run_number": st.integers(1, 10**6),
        "host": st.none() | _TEXT,
        # a move's changes may carry the class as its enum or as its value
        "failure_class": st.none()
        | st.sampled_from(FailureClass)
        | st.sampled_from([f.value for f in FailureClass]),
        "exit_code": st.none() | st.integers(-255, 255),
        "signal": st.none() | st.integers(1, 64),
        "error_brief": st.none() | st.text(max_size=200),
        "message_id": st.uuids(),
        "sent_at": st.datetimes(timezones=_ZONES),
    }
)


@given(_FIELDS)
def test_a_task_events_body_is_what_the_model_dumps(fields: dict[str, Any]) -> None:
    body = task_event_body(**fields)

    dumped = to_jsonable(TaskEvent(**fields))
    assert body == dumped
    assert list(body) == list(dumped)  # in its order too
    assert all(type(v) in (str, int, type(None)) for v in body.values())  # plain JSON values
