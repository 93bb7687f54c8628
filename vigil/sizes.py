"""Byte counts as people write and read them: `10G`, `500MiB`, `1.5 TB` in, `1.5 GiB` out."""

import re
from typing import Final

_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SIZE_RE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgtp])(ib|b)?|b)?\s*", re.IGNORECASE)
_POWERS: Final = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """`text` as bytes: a number with an optional unit, binary (`KiB`, `GiB`; `K`, `G` too) or
    decimal (`kB`, `GB`); ValueError saying so when it is none."""
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{text[:40]!r} is not a size: a number of bytes, or one with a unit"
            " (500M, 10G, 1.5TiB; 2TB is decimal)"
        )
    number, unit, suffix = match.groups()
    if unit is None:
        return round(float(number))
    base = 1000 if suffix is not None and suffix.lower() == "b" else 1024
    power: int = base ** _POWERS[unit.lower()]
    return round(float(number) * power)


def human_size(count: int) -> str:
    """`count` bytes in the largest binary unit that keeps it at least 1 (`1.5 GiB`)."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return (
                str(count) + " B" if unit == "B" else f"{value:.1f}".removesuffix(".0") + f" {unit}"
            )
        value /= 1024
    raise AssertionError("unreachable")
