"""Byte counts as people read them (`1 MiB`, `512 KiB`, `10 B`), for messages."""

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_size(count: int) -> str:
    """`count` bytes in the largest binary unit that keeps it at least 1, with at most one
    decimal (`1.5 MiB`); plain bytes below 1 KiB."""
    value = float(count)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            text = f"{value:.1f}".removesuffix(".0") if unit != "B" else str(count)
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
