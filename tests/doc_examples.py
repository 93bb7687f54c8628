"""The runnable examples of the docs: which blocks run, what they must print, and how their
output is compared (pure: no I/O but reading the pages). `tests/e2e/test_docs.py` runs them,
the README's in a fresh clone after `scripts/up` (`tests/e2e/test_scripts_up.py`).

A fenced block runs when the line before it is `<!-- doc-test -->`. The marked blocks of one
page run in order, in one shell session (a variable a block sets is there for the next): the
README's from the clone's root, the others' in a scratch directory holding the files of
`docs/examples/campaign/`:

- a `console` block is a transcript: each `$ ` line is a command (a line ending in `\\` or `|`
  goes on), the lines up to the next command are output it must print, in that order (it may
  print more); a trailing comment `# exit N` says its exit status, otherwise 0;
- an `sh` or `bash` block runs as a script under `set -eo pipefail` and must exit 0, and says
  what it leaves behind in its marker, `<!-- doc-test: makes N GLOB -->`: it must make exactly
  N new files matching GLOB in the directory it runs in (the README's harvest loop: one
  download per task), so a loop that ran zero times fails. Every command runs with `pipefail`.

In the expected output, whitespace runs count as one space, `(...)` stands for any text, a job or
task id for any id (the same actual id wherever the block shows the same one, and later
commands of the block get the actual id), and lines of the progress bar (`━`), drawn only on a
terminal, are skipped. The URL `http://127.0.0.1:8000` stands for the running API's.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

ROOT: Final = Path(__file__).resolve().parents[1]
PAGES: Final = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
FILES: Final = ROOT / "docs" / "examples" / "campaign"
MARK: Final = "<!-- doc-test -->"
#: A script's marker: what it must make.
_MAKES: Final = re.compile(r"<!-- doc-test: makes (\d+) (\S+) -->")
DOC_URL: Final = "http://127.0.0.1:8000"
ID: Final = re.compile(r"\b[jt]-[0-9a-z]{12}\b")
_EXIT: Final = re.compile(r"#\s*exits?\s+(\d+)\s*(?::.*)?$")
_ANY: Final = "(...)"
_TERMINAL_ONLY: Final = "━"


@dataclass
class Step:
    """One command of a block and what it must do."""

    command: str
    expected: list[str] = field(default_factory=list)
    status: int = 0


@dataclass(frozen=True)
class Block:
    """A runnable block: where it is, its kind and its steps (a script is one step)."""

    page: Path
    line: int
    kind: Literal["console", "script"]
    steps: list[Step]
    #: A script's files: how many new ones, matching which glob.
    makes: tuple[int, str] | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's runnable blocks, in order."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    for n, line in enumerate(lines):
        makes = _MAKES.fullmatch(line.strip())
        if line.strip() != MARK and makes is None:
            continue
        fence = lines[n + 1] if n + 1 < len(lines) else ""
        info = fence.removeprefix("```").strip()
        if not fence.startswith("```") or info not in ("console", "sh", "bash"):
            raise ValueError(f"{page.name}:{n + 1}: {MARK} must precede a console/sh/bash block")
        end = next(k for k in range(n + 2, len(lines)) if lines[k].startswith("```"))
        body = lines[n + 2 : end]
        if info == "console":
            found.append(Block(page, n + 3, "console", _transcript(body)))
        elif makes is None:
            raise ValueError(
                f"{page.name}:{n + 1}: a script says what it makes, or it cannot fail on"
                " doing nothing: <!-- doc-test: makes N GLOB -->"
            )
        else:
            script = [Step("\n".join(body))]
            found.append(Block(page, n + 3, "script", script, (int(makes[1]), makes[2])))
    return found


def _transcript(body: list[str]) -> list[Step]:
    steps: list[Step] = []
    going_on = False
    for line in body:
        if going_on:
            steps[-1].command += "\n" + line
        elif line.startswith("$ "):
            steps.append(Step(line[2:]))
        elif steps and _TERMINAL_ONLY not in line and line.strip():
            steps[-1].expected.append(line)
            continue
        else:
            continue
        going_on = line.rstrip().endswith(("\\", "|"))
        status = _EXIT.search(line)
        if status is not None:
            steps[-1].status = int(status.group(1))
    return steps


def _pattern(expected: str) -> re.Pattern[str]:
    """A regex for an expected line: ids captured, `(...)` any text, whitespace runs alike."""
    parts = re.split(r"(\b[jt]-[0-9a-z]{12}\b|\(\.\.\.\))", _squeeze(expected))
    regex = ""
    for part in parts:
        if part == _ANY:
            regex += ".*"
        elif ID.fullmatch(part):
            regex += f"({part[:2]}[0-9a-z]{{12}})"
        else:
            regex += re.escape(part)
    return re.compile(regex)


def _squeeze(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Ids:
    """The ids a block shows, and the actual ones they stand for."""

    actual: dict[str, str] = field(default_factory=dict)

    def into(self, command: str) -> str:
        """The command with the ids seen so far replaced by the actual ones."""
        return ID.sub(lambda m: self.actual.get(m.group(0), m.group(0)), command)

    def match(self, expected: str, line: str) -> bool:
        """Whether an actual output line is the expected one; records the ids it shows."""
        found = _pattern(expected).fullmatch(_squeeze(line))
        if found is None:
            return False
        shown = ID.findall(_squeeze(expected))
        pairs = dict(zip(shown, found.groups(), strict=True))
        if any(self.actual.get(doc, real) != real for doc, real in pairs.items()):
            return False
        self.actual.update(pairs)
        return True


def missing(expected: list[str], output: str, ids: Ids) -> list[str]:
    """The expected lines not found in `output` in order (empty: it printed them all)."""
    lines = iter(output.splitlines())
    for n, wanted in enumerate(expected):
        if not any(ids.match(wanted, line) for line in lines):
            return expected[n:]
    return []
