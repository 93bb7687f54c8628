"""Inputs read from a file, one a line (`vigil submit --inputs-file`, `vigil append`)."""

from pathlib import Path

import pytest

from vigil import inputs_file
from vigil.errors import JobFileError


def test_each_line_is_an_input_without_its_line_ending_and_blank_lines_are_skipped() -> None:
    text = 'a b\r\n\n  c \n\t\n{"x": 1}'

    assert inputs_file.parse(text, "f") == ["a b", "  c ", '{"x": 1}']


def test_json_lines_are_json_values() -> None:
    assert inputs_file.parse('{"x": 1}\n\n7\n"s"\nnull\r\n', "f", as_json=True) == [
        {"x": 1}, 7, "s", None,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\n{oops\n", "f:2: not valid JSON"),
        ("Infinity\n", "f:1: inf is not a JSON number"),
    ],
)
def test_a_line_that_is_not_json_is_named(text: str, message: str) -> None:
    with pytest.raises(JobFileError, match=message):
        inputs_file.parse(text, "f", as_json=True)


def test_a_jsonl_file_is_read_as_json_lines_and_others_as_text(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("[1]\n")
    (tmp_path / "in.txt").write_text("[1]\n")

    assert inputs_file.load(str(tmp_path / "in.jsonl")) == [[1]]
    assert inputs_file.load(str(tmp_path / "in.txt")) == ["[1]"]
    assert inputs_file.load(str(tmp_path / "in.txt"), jsonl=True) == [[1]]


def test_a_file_that_is_missing_or_not_text_says_so(tmp_path: Path) -> None:
    (tmp_path / "bin").write_bytes(b"ok\n\xff\xfe\n")

    with pytest.raises(JobFileError, match=r"cannot read inputs file .*nope"):
        inputs_file.load(str(tmp_path / "nope"))
    with pytest.raises(JobFileError, match="bin:2: not UTF-8 text"):
        inputs_file.load(str(tmp_path / "bin"))
