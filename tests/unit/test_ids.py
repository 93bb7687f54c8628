"""Server-made ids: short, safe in routing keys and Redis keys, and folding of free strings."""

import re

import pytest

from shared.domain.ids import ID_PATTERN, is_safe_id, new_id, new_ids, to_safe_id


@pytest.mark.parametrize("prefix", ["j", "t", "u"])
def test_when_an_id_is_made__it_is_the_prefix_a_dash_and_twelve_base32_chars(prefix: str) -> None:
    value = new_id(prefix)
    assert re.fullmatch(prefix + r"-[0-9abcdefghjkmnpqrstvwxyz]{12}", value)
    assert is_safe_id(value)
    assert not set(value) & set(".*#:/ ")


def test_when_many_ids_are_made__they_are_all_different() -> None:
    ids = {new_id("t") for _ in range(10_000)}
    assert len(ids) == 10_000


def test_ids_made_in_bulk_look_like_the_others_are_all_different_and_use_every_symbol() -> None:
    ids = new_ids("t", 10_000)
    assert len(ids) == len(set(ids)) == 10_000
    assert all(re.fullmatch(r"t-[0-9abcdefghjkmnpqrstvwxyz]{12}", i) for i in ids)
    assert set("".join(i[2:] for i in ids)) == set("0123456789abcdefghjkmnpqrstvwxyz")
    assert new_ids("t", 0) == []


@pytest.mark.parametrize("value", ["a", "0", "j-3k9x0q7mzt1a", "host-01", "a-", "x" * 63, "9lives"])
def test_when_a_value_is_lowercase_alnum_and_dashes__it_is_safe(value: str) -> None:
    assert is_safe_id(value)
    assert re.fullmatch(ID_PATTERN, value)


@pytest.mark.parametrize(
    "value",
    ["", "-a", "A", "a.b", "a*b", "a#b", "a_b", "a b", "a:b", "a/b", "é", "x" * 64, "a\n"],
)
def test_when_a_value_has_anything_else__it_is_not_safe(value: str) -> None:
    assert not is_safe_id(value)


@pytest.mark.parametrize(
    ("value", "folded"),
    [
        ("worker-01", "worker-01"),
        ("Node7.Cluster.Example.ORG", "node7-cluster-example-org"),
        ("my_host name", "my-host-name"),
        ("--edge--", "edge"),
        ("a..*#..b", "a-b"),
        ("héllo", "h-llo"),
        ("x" * 100, "x" * 63),
    ],
)
def test_when_a_free_string_is_folded__the_result_is_a_safe_id(value: str, folded: str) -> None:
    assert to_safe_id(value) == folded
    assert is_safe_id(to_safe_id(value))


@pytest.mark.parametrize("value", ["", "...", "***", "é", "-_-"])
def test_when_nothing_safe_is_left_after_folding__value_error_is_raised(value: str) -> None:
    with pytest.raises(ValueError, match="cannot make an id"):
        to_safe_id(value)
