"""Cutting a relay batch's events into bundles, and reading a bundle back."""

import json

from shared.messaging.event_bundles import (
    COUNT_HEADER,
    bundle_body,
    copied_to,
    runs,
    subject,
    unbundle,
)


def test_the_subject_of_an_event_is_its_keys_last_part() -> None:
    assert subject("task.on_cpu.j-1") == "j-1"
    assert subject("host.quarantined.h-1") == "h-1"


def test_consecutive_events_of_one_subject_make_a_run() -> None:
    keys = ["task.new.j-1", "task.queued.j-1", "task.new.j-2", "job.succeeded.j-1"]
    assert runs(keys) == [range(0, 2), range(2, 3), range(3, 4)]


def test_a_run_is_cut_at_its_most_events() -> None:
    assert runs(["task.new.j-1"] * 5, most=2) == [range(0, 2), range(2, 4), range(4, 5)]


def test_no_events_make_no_runs() -> None:
    assert runs([]) == []


def test_a_bundle_is_copied_to_each_other_key_once() -> None:
    keys = ["task.new.j-1", "task.on_cpu.j-1", "task.new.j-1", "task.completed.j-1"]
    assert copied_to(keys) == ["task.on_cpu.j-1", "task.completed.j-1"]


def test_a_bundle_reads_back_as_its_events_in_order() -> None:
    keys = ["task.new.j-1", "task.queued.j-1"]
    body = bundle_body(keys, [b'{"seq":1,"a":"x\\"y"}', b'{"seq":2}'])
    assert json.loads(body)[0] == {"routing_key": "task.new.j-1", "body": {"seq": 1, "a": 'x"y'}}
    assert unbundle("task.new.j-1", {COUNT_HEADER: 2, "seq": 2}, body) == [
        ("task.new.j-1", {"seq": 1, "a": 'x"y'}),
        ("task.queued.j-1", {"seq": 2}),
    ]


def test_a_message_of_one_event_reads_back_as_itself() -> None:
    assert unbundle("task.new.j-1", {"seq": 3}, b'{"seq":3}') == [("task.new.j-1", {"seq": 3})]
    # a JSON array without the header is one event's body, whatever it holds
    assert unbundle("log.info.j-1", None, b"[1]") == [("log.info.j-1", [1])]
