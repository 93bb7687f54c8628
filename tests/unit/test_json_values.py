"""The size limit of a submitted JSON value: counted as compact UTF-8 JSON, whatever shortcut
spares the encoding of short text."""

import pytest

from services.api.json_values import encoded_size, size_over

LIMIT = 65_536


@pytest.mark.parametrize(
    "value",
    [
        "\x01" * 10_922,  # 6 bytes a character as JSON: 65,534 bytes, just under
        "é" * 32_000,  # 2 bytes a character
        "plain",
        None,
        True,
        1.5,
        12,
        {"a": "b" * 60_000},
    ],
)
def test_a_value_within_the_limit_is_not_over_it(value: object) -> None:
    assert encoded_size(value) <= LIMIT
    assert size_over(value, LIMIT) is None


@pytest.mark.parametrize(
    "value",
    [
        "\x01" * 10_923,  # 65,540 bytes as JSON from 10,923 characters
        "y" * 65_540,
        "€" * 21_846,  # 3 bytes a character
        ["y" * 40_000, "z" * 40_000],
        [10**4000] * 20,
    ],
)
def test_a_value_over_the_limit_is_said_to_be_with_its_size(value: object) -> None:
    assert size_over(value, LIMIT) == encoded_size(value) > LIMIT
