"""Inputs read from a file (`vigil submit --inputs-file`, `vigil append`): one input a line.

A line's text is the input (a string), or, for a `.jsonl` file or with `--jsonl`, the JSON
value it holds (`{"scene": 3}`, `7`, `"a"`). Blank lines are skipped; the line ending (`\\n`
or `\\r\\n`) is not part of the input. `-` reads standard input. Errors name the line.
"""

import json
import sys
from pathlib import Path
from typing import IO, Any, Final

from vigil.errors import JobFileError
from vigil.jobfile import check_json

#: The name that stands for standard input.
STDIN: Final = "-"
#: Largest inputs file read (the API's default body limit is 16 MiB).
MAX_FILE_BYTES: Final = 64 * 1024 * 1024


def load(name: str, *, jsonl: bool = False) -> list[Any]:
    """The inputs in file `name` (`-`: standard input), as JSON lines when `jsonl` or when
    the name ends in `.jsonl`; `JobFileError` saying what is wrong and on which line."""
    as_json = jsonl or name.lower().endswith(".jsonl")
    shown = "standard input" if name == STDIN else name
    try:
        if name == STDIN:
            text = _read(sys.stdin.buffer, shown)
        else:
            with Path(name).open("rb") as handle:
                text = _read(handle, shown)
    except OSError as exc:
        raise JobFileError(f"cannot read inputs file {shown}: {exc.strerror or exc}") from exc
    return parse(text, shown, as_json=as_json)


def _read(handle: IO[bytes], shown: str) -> str:
    data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise JobFileError(f"{shown}: over {MAX_FILE_BYTES} bytes; split it (`vigil append`)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise JobFileError(f"{shown}:{line}: not UTF-8 text") from exc


def parse(text: str, shown: str, *, as_json: bool = False) -> list[Any]:
    """The inputs in `text`, one a line (`shown` names it in errors)."""
    inputs: list[Any] = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if not as_json:
            inputs.append(line)
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JobFileError(f"{shown}:{number}: not valid JSON: {exc.msg}") from exc
        check_json(value, f"{shown}:{number}")
        inputs.append(value)
    return inputs
