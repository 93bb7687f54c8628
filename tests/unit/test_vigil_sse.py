"""Reading the `GET /events` stream: SSE lines in, events out, odd messages skipped."""

import json
import logging

import pytest

from vigil.sse import Event, EventStream, Resume, events_in


def _message(key: str, body: dict[str, object]) -> list[str]:
    return [f"data: {json.dumps({'routing_key': key, 'body': body})}", ""]


def test_when_messages_and_keepalives_arrive__each_message_is_one_event_in_order() -> None:
    lines = [
        ": keepalive",
        "",
        *_message("task.completed.j-1", {"state": "completed"}),
        ": keepalive",
        *_message("job.succeeded.j-1", {"job_id": "j-1"}),
    ]

    assert list(events_in(lines)) == [
        Event("task.completed.j-1", {"state": "completed"}),
        Event("job.succeeded.j-1", {"job_id": "j-1"}),
    ]


def test_when_the_data_spans_lines_or_has_crlf__it_is_joined_as_sse_says() -> None:
    lines = ['data: {"routing_key": "a.b",\r\n', 'data:"body": {"x": 1}}\r\n', "\r\n"]

    assert list(events_in(lines)) == [Event("a.b", {"x": 1})]


def test_when_a_message_has_no_blank_line_yet__it_is_not_given_early() -> None:
    assert list(events_in(['data: {"routing_key": "a", "body": {}}'])) == []


def test_when_fields_other_than_data_and_id_come__they_are_ignored() -> None:
    lines = ["retry: 1000", 'data: {"routing_key": "a", "body": {}}', "x-other: 1", ""]

    assert list(events_in(lines)) == [Event("a", {})]


def test_an_id_field_is_the_events_position_and_a_message_without_data_moves_the_position() -> None:
    # given: the opening (position only), an event with a position, a log line without one
    lines = [": subscribed", "id: 7", ""]
    lines += ["id: 8", 'data: {"routing_key": "task.on_cpu.j-1", "body": {"seq": 8}}', ""]
    lines += ['data: {"routing_key": "log.info.j-1", "body": {}}', ""]
    stream = EventStream(lines)
    # when
    events = list(stream)
    # then
    assert [(e.routing_key, e.seq) for e in events] == [
        ("task.on_cpu.j-1", 8),
        ("log.info.j-1", None),
    ]
    assert stream.position == 8


def test_the_position_of_a_stream_that_gave_no_event_is_where_it_opened() -> None:
    stream = EventStream([": subscribed", "id: 41", "", ": keepalive", ""])
    assert list(stream) == []
    assert stream.position == 41


def test_a_follower_delivers_each_position_once_and_log_lines_always() -> None:
    resume = Resume(last=5)
    seen: list[int | None] = []
    for seq in (4, 5, 6, 6, None, 7, 3):
        event = Event("k", {}, seq)
        if resume.fresh(event):
            seen.append(seq)
        resume.reached(seq)
    assert seen == [6, None, 7]
    assert resume.last == 7


@pytest.mark.parametrize(
    "lines",
    [
        ["data: not json", ""],
        ['data: {"body": {}}', ""],
        ['data: {"routing_key": "a", "body": [1]}', ""],
        ["data: [1, 2]", ""],
        ["event: error", 'data: {"routing_key": "a", "body": {}}', ""],
    ],
)
def test_when_a_message_is_not_an_event__it_is_skipped_and_the_next_still_comes(
    lines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    after = _message("b", {"ok": True})

    with caplog.at_level(logging.WARNING, logger="vigil.sse"):
        assert list(events_in([*lines, *after])) == [Event("b", {"ok": True})]
