"""How the docs runner reads a page's runnable blocks and compares what they print."""

from pathlib import Path

import pytest

from tests import doc_examples
from tests.doc_examples import Ids, missing


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_only_marked_blocks_run_and_a_transcript_gives_commands_outputs_and_statuses(
    tmp_path: Path,
) -> None:
    page = _page(
        tmp_path,
        "```console\n$ not marked\n```\n"
        "<!-- doc-test -->\n```console\n"
        "$ JOB=$(vigil submit job.yaml)\n"
        '$ vigil wait "$JOB"          # exit 1: the job failed\n'
        "j-3k9x0q7mzt1a active ━━━━━━ 2/3\n"
        "job j-3k9x0q7mzt1a failed\n"
        '$ vigil outputs "$JOB" --json |\n'
        "    jq length\n"
        "3\n```\n"
        "<!-- doc-test: makes 2 t-*.txt -->\n```sh\nset -x\necho hi\n```\n",
    )
    [console, script] = doc_examples.blocks(page)
    assert console.kind == "console" and script.kind == "script"
    assert [(s.command, s.status, s.expected) for s in console.steps] == [
        ("JOB=$(vigil submit job.yaml)", 0, []),
        ('vigil wait "$JOB"          # exit 1: the job failed', 1, ["job j-3k9x0q7mzt1a failed"]),
        ('vigil outputs "$JOB" --json |\n    jq length', 0, ["3"]),
    ]
    assert [s.command for s in script.steps] == ["set -x\necho hi"]
    assert (console.makes, script.makes) == (None, (2, "t-*.txt"))


def test_a_script_that_does_not_say_what_it_makes_is_an_error(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- doc-test -->\n```sh\necho hi\n```\n")
    with pytest.raises(ValueError, match="says what it makes"):
        doc_examples.blocks(page)


def test_a_mark_before_anything_but_a_shell_block_is_an_error(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- doc-test -->\n```python\nprint()\n```\n")
    with pytest.raises(ValueError, match="must precede"):
        doc_examples.blocks(page)


def test_ids_stand_for_the_actual_ones_consistently_and_go_into_later_commands() -> None:
    ids = Ids()
    output = "noise\njob j-aaaaaaaaaaaa failed:  2 completed\n t-bbbbbbbbbbbb  2  exit\n"
    assert (
        missing(["job j-3k9x0q7mzt1a failed: 2 completed", "t-pkqk84nep7mr 2 exit"], output, ids)
        == []
    )
    assert ids.into("vigil recover t-pkqk84nep7mr") == "vigil recover t-bbbbbbbbbbbb"
    # the same shown id must stand for the same actual one
    assert missing(["job j-3k9x0q7mzt1a"], "job j-cccccccccccc", ids) == ["job j-3k9x0q7mzt1a"]


def test_expected_lines_must_come_in_order_and_any_text_stands_for_any() -> None:
    output = "vigil: job j-aaaaaaaaaaaa is completed: no (because) ; do this (409)\nlast\n"
    assert (
        missing(["vigil: job j-3k9x0q7mzt1a is (...): no (...); do this (409)"], output, Ids())
        == []
    )
    assert missing(["last", "vigil: (...)"], output, Ids()) == ["vigil: (...)"]
    assert missing(["absent"], output, Ids()) == ["absent"]


def test_the_project_pages_have_runnable_blocks() -> None:
    runnable = {p.name for p in doc_examples.PAGES if doc_examples.blocks(p)}
    assert {"README.md", "cli.md"} <= runnable
