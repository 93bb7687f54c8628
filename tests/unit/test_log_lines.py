"""Output lines: severity from a leading level word, stream defaults, progress, cleaning."""

import subprocess
from typing import Literal

import pytest

from shared.domain.log_lines import (
    MAX_LINE_CHARS,
    ShellNotes,
    parse_line,
    shell_killed,
    shell_refusal,
    shell_syntax_error,
)
from shared.domain.messages import Severity


@pytest.mark.parametrize(
    ("line", "severity"),
    [
        ("DEBUG: cache warm", Severity.DEBUG),
        ("INFO: step 1 of 3", Severity.INFO),
        ("WARNING: disk 90% full", Severity.WARNING),
        ("ERROR: cannot open input", Severity.ERROR),
        ("CRITICAL: out of memory", Severity.CRITICAL),
        ("FATAL: giving up", Severity.FATAL),
        ("DEBUG cache warm", Severity.DEBUG),
        ("INFO step 1 of 3", Severity.INFO),
        ("WARNING disk 90% full", Severity.WARNING),
        ("ERROR cannot open input", Severity.ERROR),
        ("CRITICAL out of memory", Severity.CRITICAL),
        ("FATAL giving up", Severity.FATAL),
        ("ERROR:root:boom", Severity.ERROR),
        ("WARNING:my.module:slow", Severity.WARNING),
        ("CRITICAL:root:", Severity.CRITICAL),
    ],
)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_when_a_line_starts_with_a_level_word__it_gets_that_severity(
    line: str, severity: Severity, stream: Literal["stdout", "stderr"]
) -> None:
    parsed = parse_line(line, stream)
    assert parsed.severity is severity
    assert parsed.line == line


@pytest.mark.parametrize(
    "line",
    [
        "error: lowercase is not a level word",
        "Error: neither is capitalised",
        "ERRORS were counted: 0",
        "ERROR",
        "an ERROR: in the middle",
        " ERROR: after a space",
        "WARN: not one of the six",
        "",
    ],
)
def test_when_a_line_has_no_leading_level_word__the_stream_decides(line: str) -> None:
    assert parse_line(line, "stdout").severity is Severity.INFO
    assert parse_line(line, "stderr").severity is Severity.WARNING


@pytest.mark.parametrize(("value", "progress"), [("0", 0), ("42", 42), ("100", 100)])
def test_when_a_line_reports_progress_in_range__the_progress_is_read(
    value: str, progress: int
) -> None:
    parsed = parse_line(f"PROGRESS: {value}\n", "stdout")
    assert parsed.progress == progress
    assert parsed.severity is Severity.INFO


@pytest.mark.parametrize(
    "line",
    ["PROGRESS: 101", "PROGRESS: 1000", "PROGRESS: -1", "PROGRESS: 5%", "PROGRESS: half", "x"],
)
def test_when_a_progress_line_is_out_of_range_or_malformed__no_progress_is_read(
    line: str,
) -> None:
    assert parse_line(line, "stdout").progress is None


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_when_a_line_ends_with_a_newline__the_newline_is_stripped(ending: str) -> None:
    parsed = parse_line("ERROR: boom" + ending, "stdout")
    assert parsed.line == "ERROR: boom"
    assert parsed.severity is Severity.ERROR


def test_when_a_line_is_too_long__it_is_cut_to_the_limit() -> None:
    parsed = parse_line("FATAL: " + "x" * (3 * MAX_LINE_CHARS) + "\n", "stderr")
    assert len(parsed.line) == MAX_LINE_CHARS
    assert parsed.line.startswith("FATAL: xxx")
    assert parsed.severity is Severity.FATAL


def test_when_a_line_is_exactly_at_the_limit__it_is_kept_whole() -> None:
    line = "y" * MAX_LINE_CHARS
    assert parse_line(line + "\n", "stdout").line == line


def test_when_a_line_holds_a_nul__it_becomes_the_replacement_character() -> None:
    assert parse_line("a\x00b\n", "stdout").line == "a\ufffdb"


@pytest.mark.parametrize("script", ['echo "unterminated', "if true; then echo x", "echo )"])
def test_what_bash_says_of_a_script_it_cannot_parse_is_told_apart(script: str) -> None:
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)

    assert ran.returncode == 2
    assert shell_syntax_error(ran.stderr.splitlines()[0])


@pytest.mark.parametrize(
    "line", ["ls: cannot access 'x': No such file or directory", "WARNING: syntax is fine"]
)
def test_other_stderr_lines_are_no_syntax_error(line: str) -> None:
    assert not shell_syntax_error(line)


@pytest.mark.parametrize(
    ("script", "command", "why"),
    [
        ("frobnicate-x1", "frobnicate-x1", "command not found"),
        ("/dev/null", "/dev/null", "Permission denied"),
    ],
)
def test_what_bash_says_of_a_command_it_cannot_run_names_it(
    script: str, command: str, why: str
) -> None:
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)

    refusal = shell_refusal(ran.stderr.splitlines()[-1])

    assert refusal is not None and (refusal.command, refusal.why) == (command, why)


def test_what_bash_says_of_a_killed_process_names_its_command() -> None:
    script = 'sh -c "kill -9 \\$\\$"; echo after'
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)
    notes = ShellNotes()
    for line in ran.stderr.splitlines():
        notes.heard(line)

    assert ran.returncode == 0
    assert notes.killed is not None and shell_killed(notes.killed) == 'sh -c "kill -9 \\$\\$"'
    assert shell_killed("WARNING: Killed the cache") is None
