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
#: What a shell writes when it cannot run a command (`bash: line 1: foo: command not found`,
#: `bash: ./run.sh: Permission denied`), before it exits 127 or 126.
_SHELL_REFUSAL_RE: Final = re.compile(
    r"^\S+: (?:-c: )?(?:line \d+: )?(?P<command>.+): (?P<why>command not found|Permission denied"
    r"|Is a directory|cannot execute[^:]*(?:: .*)?)$"
)
#: What bash writes when a process it waited for (not its last) was killed by SIGKILL, as the
#: kernel's OOM killer does (`bash: line 1:  1234 Killed   python3 big.py`).
_SHELL_KILLED_RE: Final = re.compile(r"^\S+: (?:line \d+: )?\s*\d+ Killed\s+(?P<command>.+)$")
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
    and a line it refused made the whole batch of lines fail (a user could hide a
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


@dataclass(frozen=True)
class ShellRefusal:
    """A command the shell could not run, and why (`command not found`, `Permission denied`)."""

    command: str
    why: str


def shell_refusal(line: str) -> ShellRefusal | None:
    """The command a shell said (in stderr `line`) it could not run, if the line says so."""
    found = _SHELL_REFUSAL_RE.match(line)
    return ShellRefusal(found["command"], found["why"]) if found else None


def shell_killed(line: str) -> str | None:
    """The command of a process that bash says (in stderr `line`) was killed by SIGKILL."""
    found = _SHELL_KILLED_RE.match(line)
    return found["command"].strip() if found else None


@dataclass
class ShellNotes:
    """What bash itself said on a command's stderr about how its script went: each the line
    as written, kept to name the cause of a failure (`shared.domain.outcomes`)."""

    #: The first line saying it could not parse the script.
    syntax_error: str | None = None
    #: The last line saying it could not run a command (`shell_refusal`).
    refusal: str | None = None
    #: The last line saying a process it waited for was killed by SIGKILL (`shell_killed`).
    killed: str | None = None

    def heard(self, line: str) -> None:
        """Take one stderr line of the command."""
        if self.syntax_error is None and shell_syntax_error(line):
            self.syntax_error = line
        elif shell_refusal(line) is not None:
            self.refusal = line
        elif shell_killed(line) is not None:
            self.killed = line
