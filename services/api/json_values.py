"""Checks that a submitted JSON value can be stored in a jsonb column and read back as sent.

PostgreSQL refuses NUL characters and lone surrogates, jsonb refuses non-finite numbers, and
Python's `json` parser accepts `NaN`/`Infinity`: without these checks such input would fail deep
in the database as a 500.
"""

import json
import math
from typing import Any, Final

#: Deepest nesting accepted in an input or a parameter (lists and objects).
MAX_DEPTH: Final = 32


def check(value: Any, what: str) -> Any:
    """Return `value` if it is plain, storable JSON; raise ValueError naming `what` otherwise."""
    problem = _problem(value, 0)
    if problem:
        raise ValueError(f"{what} {problem}")
    return value


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored in PostgreSQL (a NUL, a lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode text)"
    return None


def encoded_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON (the size limits are stated in these)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


#: The most bytes one character of a string takes in JSON (`\u001f`; UTF-8 needs at most 4).
_MOST_BYTES_A_CHAR: Final = 6


def size_over(value: Any, limit: int) -> int | None:
    """`encoded_size(value)` when it is over `limit`, else None. A string that could not be
    over it even if every character took the most bytes one can (and a bool, None or float)
    is not encoded: a job's 100,000 short inputs are checked without 100,000 encodings."""
    if value is None or isinstance(value, bool | float):
        return None
    if isinstance(value, str) and _MOST_BYTES_A_CHAR * len(value) + 2 <= limit:
        return None
    size = encoded_size(value)
    return size if size > limit else None


def _problem(value: Any, depth: int) -> str | None:
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "contains a number that is not finite"
    if isinstance(value, str):
        return text_problem(value)
    if depth >= MAX_DEPTH:
        return f"is nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, list):
        return next((p for p in (_problem(v, depth + 1) for v in value) if p), None)
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _problem(key, depth) if isinstance(key, str) else "has a non-text key"
            problem = problem or _problem(item, depth + 1)
            if problem:
                return problem
        return None
    return f"is not a JSON value ({type(value).__name__})"
