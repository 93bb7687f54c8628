"""Reading a command's output lines: severity and progress (design §3). Pure functions."""

import re
from dataclasses import dataclass
from typing import Final, Literal

from shared.domain.messages import Severity

_LEVEL_RE: Final = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL|FATAL)(?::|\s)")
_PROGRESS_RE: Final = re.compile(r"^PROGRESS:\s*(\d{1,3})\s*$")
#: What bash writes on stderr when it cannot parse a script, before it exits 2 (`bash: -c:
#: line 1: unexpected EOF while looking for matching ...`, `...: syntax error: ...`).
_SHELL_SYNTAX_RE: Final = re.compile(r"syntax error|unexpected EOF while looking for matching")
#: Longer lines are cut so that one runaway line cannot flood the broker or the database.
MAX_LINE_CHARS: Final = 8192


@dataclass(frozen=True)
class ParsedLine:
    """A line with its severity, and its progress when it is a `PROGRESS: n` line."""

    line: str
    severity: Severity
    progress: int | None = None


def parse_line(raw: str, stream: Literal["stdout", "stderr"]) -> ParsedLine:
    """Classify one output line: a leading level word wins, else stdout=info, stderr=warning.

    A NUL becomes U+FFFD, as undecodable bytes already did: PostgreSQL's text cannot hold it,
    and a line it refused made the whole batch of lines fail (issue 17: a user could hide a
    task's output that way)."""
    line = raw.rstrip("\r\n")[:MAX_LINE_CHARS].replace("\x00", "\ufffd")
    level = _LEVEL_RE.match(line)
    if level:
        severity = Severity(level.group(1).lower())
    else:
        severity = Severity.INFO if stream == "stdout" else Severity.WARNING
    progress_match = _PROGRESS_RE.match(line)
    progress = None
    if progress_match and int(progress_match.group(1)) <= 100:
        progress = int(progress_match.group(1))
    return ParsedLine(line=line, severity=severity, progress=progress)


def shell_syntax_error(line: str) -> bool:
    """Whether `line`, written on stderr, is bash saying that it cannot parse a script."""
    return _SHELL_SYNTAX_RE.search(line) is not None
