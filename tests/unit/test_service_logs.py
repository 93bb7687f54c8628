"""The services' own log lines: a job's text in them (a brief, a task name) is escaped, so it
can neither drive the reader's terminal nor forge a line of its own."""

import io
import logging
from collections.abc import Iterator

import pytest

from shared.runtime import logs


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.configure_logging("worker")
    yield stream
    root.handlers[:], level = saved
    root.setLevel(level)


def test_control_characters_of_a_message_and_its_fields_are_escaped(
    captured: io.StringIO,
) -> None:
    brief = "\x1b[2J\x1b[31mgot you\nFAKE 2026-01-01 ERROR scheduler: forged"

    logging.getLogger("t").warning("task failed: %s", brief, extra={"task_id": "t-\x07x"})

    [line] = captured.getvalue().splitlines()
    assert "\\x1b[2J\\x1b[31mgot you\\x0aFAKE" in line
    assert "task_id=t-\\x07x" in line
    assert "\x1b" not in line and "\x07" not in line


def test_a_traceback_keeps_its_lines_and_loses_its_escapes(captured: io.StringIO) -> None:
    try:
        raise ValueError("bad \x1b[31mname")
    except ValueError:
        logging.getLogger("t").exception("failed")

    text = captured.getvalue()
    assert "Traceback (most recent call last):\n" in text
    assert "ValueError: bad \\x1b[31mname" in text and "\x1b" not in text
