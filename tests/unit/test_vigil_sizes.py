"""Sizes as an operator types them (`vigil users quota NAME SIZE`) and as the CLI shows them."""

import pytest

from vigil.cli.accounts import _quota
from vigil.errors import UsageError
from vigil.sizes import human_size, parse_size


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("0", 0),
        ("1536", 1536),
        ("10G", 10 * 1024**3),
        ("10 GiB", 10 * 1024**3),
        ("500m", 500 * 1024**2),
        ("1.5TiB", 3 * 1024**4 // 2),
        ("2TB", 2 * 10**12),
        ("3kB", 3000),
    ],
)
def test_a_size_is_read_in_binary_units_unless_written_decimal(text: str, count: int) -> None:
    assert parse_size(text) == count


@pytest.mark.parametrize("text", ["", "lots", "-1G", "10 XB", "1e9"])
def test_what_is_not_a_size_is_refused_saying_what_is(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size: a number of bytes"):
        parse_size(text)


def test_a_quota_is_a_size__none_for_no_quota__default_for_the_installations() -> None:
    assert [_quota(t) for t in ("10G", "0", "none", "default")] == [10 * 1024**3, 0, 0, None]
    with pytest.raises(UsageError, match="or 'none', or 'default'"):
        _quota("lots")


def test_sizes_show_in_the_largest_binary_unit() -> None:
    assert [human_size(n) for n in (0, 1023, 1024, 3 * 1024**2 // 2, 9 * 1024**2)] == [
        "0 B",
        "1023 B",
        "1 KiB",
        "1.5 MiB",
        "9 MiB",
    ]
