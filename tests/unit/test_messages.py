"""Wire messages: round trips, one error for anything foreign, tolerant reading, immutability."""

import json
from datetime import UTC, datetime
from uuid import uuid4

import pydantic
import pytest

from shared.domain.errors import InvalidMessage
from shared.domain.messages import (
    JobEvent,
    JobOutcome,
    LogRecord,
    RunStage,
    Severity,
    TaskEvent,
    WatchProcess,
    decode,
    encode,
    to_jsonable,
)
from shared.domain.states import FailureClass, Stage, TaskState

AnyMessage = RunStage | WatchProcess | TaskEvent | JobEvent | LogRecord

EVERY_MESSAGE: list[AnyMessage] = [
    RunStage(job_id="j-1", task_id="t-1", stage=Stage.CLUSTER, claim=uuid4()),
    WatchProcess(job_id="j-1", task_id="t-1", claim=uuid4(), pid=4242, create_time=1712.5),
    TaskEvent(job_id="j-1", task_id="t-1", state=TaskState.NEW),
    TaskEvent(
        job_id="j-1",
        task_id="t-1",
        state=TaskState.FAILED_ON_CLUSTER,
        previous=TaskState.ON_CPU,
        run_number=2,
        host="h-1",
        failure_class=FailureClass.SIGNAL,
        exit_code=None,
        signal=9,
        error_brief="killed by SIGKILL",
    ),
    JobEvent(job_id="j-1", outcome=JobOutcome.SUCCEEDED),
    JobEvent(job_id="j-1", outcome=JobOutcome.HUNG, task_id="t-1", brief="no output for 60 s"),
    LogRecord(
        job_id="j-1",
        task_id="t-1",
        run_number=1,
        attempt=3,
        line_no=7,
        severity=Severity.ERROR,
        stream="stderr",
        line="ERROR:root:boom",
    ),
    LogRecord(
        job_id="j-1",
        task_id="t-1",
        run_number=1,
        attempt=1,
        line_no=0,
        severity=Severity.INFO,
        stream="stdout",
        line="PROGRESS: 50",
        progress=50,
    ),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_when_a_message_is_encoded_and_decoded__it_comes_back_equal(
    message: AnyMessage,
) -> None:
    decoded = decode(encode(message))
    assert type(decoded) is type(message)
    assert decoded == message


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_when_a_message_is_made_jsonable__decoding_its_json_gives_it_back(
    message: AnyMessage,
) -> None:
    body = json.dumps(to_jsonable(message))
    assert decode(body) == message


def test_when_the_body_is_a_str__it_decodes_like_bytes() -> None:
    message = EVERY_MESSAGE[0]
    assert decode(encode(message).decode()) == message


def test_when_the_type_is_unknown__invalid_message_is_raised() -> None:
    body = json.loads(encode(JobEvent(job_id="j-1", outcome=JobOutcome.FAILED)))
    body["type"] = "launch_missiles"
    with pytest.raises(InvalidMessage):
        decode(json.dumps(body))


def test_when_the_type_is_missing__invalid_message_is_raised() -> None:
    body = json.loads(encode(JobEvent(job_id="j-1", outcome=JobOutcome.FAILED)))
    del body["type"]
    with pytest.raises(InvalidMessage):
        decode(json.dumps(body))


@pytest.mark.parametrize(
    "body",
    [b"", b"\xff\xfe\x00garbage", b"not json", b"{", b"[]", b"null", b"42", b'"run_stage"'],
    ids=["empty", "binary", "text", "truncated", "list", "null", "number", "string"],
)
def test_when_the_body_is_garbage__invalid_message_is_raised(body: bytes) -> None:
    with pytest.raises(InvalidMessage):
        decode(body)


def test_when_a_required_field_is_missing__invalid_message_is_raised() -> None:
    body = json.loads(encode(EVERY_MESSAGE[0]))
    del body["claim"]
    with pytest.raises(InvalidMessage):
        decode(json.dumps(body))


def test_when_a_field_has_a_bad_value__invalid_message_is_raised() -> None:
    body = json.loads(encode(TaskEvent(job_id="j-1", task_id="t-1", state=TaskState.NEW)))
    body["state"] = "exploded"
    with pytest.raises(InvalidMessage):
        decode(json.dumps(body))


def test_when_sent_at_is_naive__invalid_message_is_raised() -> None:
    body = json.loads(encode(JobEvent(job_id="j-1", outcome=JobOutcome.FAILED)))
    body["sent_at"] = "2024-01-01T00:00:00"
    with pytest.raises(InvalidMessage):
        decode(json.dumps(body))


def test_when_a_newer_sender_adds_fields__the_reader_ignores_them() -> None:
    message = TaskEvent(job_id="j-1", task_id="t-1", state=TaskState.QUEUED)
    body = json.loads(encode(message))
    body["added_in_v2"] = {"anything": [1, 2]}
    decoded = decode(json.dumps(body))
    assert decoded == message
    assert not hasattr(decoded, "added_in_v2")


def test_when_a_message_is_built__it_gets_an_id_and_an_aware_time() -> None:
    first = JobEvent(job_id="j-1", outcome=JobOutcome.FAILED)
    second = JobEvent(job_id="j-1", outcome=JobOutcome.FAILED)
    assert first.message_id != second.message_id
    assert first.sent_at.tzinfo is not None
    assert abs((datetime.now(UTC) - first.sent_at).total_seconds()) < 60


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_when_a_message_field_is_assigned__it_is_refused(message: AnyMessage) -> None:
    with pytest.raises(pydantic.ValidationError):
        message.job_id = "j-2"  # type: ignore[misc]
    assert message.job_id == "j-1"


def test_when_listing_severities__they_are_the_six_levels_in_order_of_gravity() -> None:
    assert [s.value for s in Severity] == [
        "debug",
        "info",
        "warning",
        "error",
        "critical",
        "fatal",
    ]
