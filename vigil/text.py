"""Text from the API made safe and short to show: control characters escaped, times to the
second. Below `render` and `pool`, which both use it."""

import re
from collections.abc import Mapping
from typing import Any, Final

_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any) -> str:
    """`value` as text with control characters (escape sequences, CR) shown as `\\xNN`."""
    text = "" if value is None else str(value)
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def when(value: Any) -> str | None:
    """An ISO 8601 time from the API shown to the second, without the offset clutter of UTC
    (None for anything but a string)."""
    if not isinstance(value, str):
        return None
    return value[:19].replace("T", " ") + (" UTC" if value.endswith(("Z", "+00:00")) else "")


def counts_text(counts: Mapping[str, int]) -> str:
    """`3 completed, 1 on_cpu`: tasks per state, most first."""
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n} {printable(state)}" for state, n in ordered if n) or "no tasks"
