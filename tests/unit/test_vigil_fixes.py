"""`vigil fix` / `vigil fixes`: options to a selector, unknown choices refused before any
request (the other usage errors are in test_vigil_cli), and how a result is shown."""

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from rich.console import Console

from shared.domain import states
from shared.domain.actions import TaskAction
from tests.unit.test_vigil_cli import _run
from vigil import calls, fixes

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_the_fix_choices_are_the_servers_values() -> None:
    assert [a.value for a in fixes.FixAction] == [a.value for a in TaskAction]
    assert [c.value for c in fixes.FailureClass] == [c.value for c in states.FailureClass]


@pytest.mark.parametrize(
    "args", [["fix", "reboot", "--state", "new"], ["fix", "recover", "--class", "bogus"]]
)
def test_when_a_choice_is_unknown__the_usage_error_exits_2(tmp_path: Path, args: list[str]) -> None:
    code, output = _run(args, tmp_path)

    assert code == 2, output


def test_when_every_option_is_given__the_selector_holds_each() -> None:
    chosen = fixes.selector(
        states=["failed_on_cluster", "failed_to_setup"],
        classes=["lost"],
        hosts=["h-1"],
        jobs=["j-1"],
        job_name="nightly-*",
        since="2h",
        until="2024-05-01T11:30:00+02:00",
        include_superseded=True,
        now=NOW,
    )

    assert chosen == {
        "states": ["failed_on_cluster", "failed_to_setup"],
        "failure_classes": ["lost"],
        "hosts": ["h-1"],
        "job_ids": ["j-1"],
        "job_name": "nightly-*",
        "updated_after": "2024-05-01T10:00:00+00:00",
        "updated_before": "2024-05-01T11:30:00+02:00",
        "include_superseded": True,
    }


def test_when_only_some_options_are_given__the_others_are_left_out() -> None:
    assert fixes.selector(states=["failed_on_cluster"], now=NOW) == {
        "states": ["failed_on_cluster"]
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", NOW - timedelta(seconds=90)),
        ("30m", NOW - timedelta(minutes=30)),
        ("1d", NOW - timedelta(days=1)),
        ("2w", NOW - timedelta(weeks=2)),
        ("2024-04-30T08:00:00Z", datetime(2024, 4, 30, 8, tzinfo=UTC)),
        (
            "2024-04-30T08:00:00-05:00",
            datetime(2024, 4, 30, 8, tzinfo=timezone(timedelta(hours=-5))),
        ),
    ],
)
def test_when_a_time_is_a_duration_or_an_iso_time__it_becomes_an_aware_time(
    text: str, expected: datetime
) -> None:
    assert fixes.point_in_time(text, NOW) == expected


def test_when_an_iso_time_has_no_offset__it_is_taken_as_local_time() -> None:
    found = fixes.point_in_time("2024-04-30T08:00:00", NOW)

    assert found.tzinfo is not None
    assert found.replace(tzinfo=None) == datetime(2024, 4, 30, 8)


def test_when_a_bulk_call_is_made__its_body_and_long_timeout_are_set() -> None:
    call = calls.bulk_action("recover", {"states": ["failed_on_cluster"]}, True, False)

    args = call.request_args("http://api", {})
    assert (args["method"], args["url"]) == ("POST", "http://api/bulk/actions")
    assert args["json"] == {
        "action": "recover",
        "selector": {"states": ["failed_on_cluster"]},
        "dry_run": True,
        "confirm": False,
    }
    assert args["timeout"] == calls.BULK_TIMEOUT_S
    assert "timeout" not in calls.hosts().request_args("http://api", {})
    listed = calls.bulk_actions(10, None).request_args("http://api", {})
    assert listed["params"] == [("limit", 10)]


def test_when_the_api_asks_for_confirmation__the_hint_names_the_option() -> None:
    message = (
        "the selector matches 150 tasks in 3 jobs (more than 100);"
        ' repeat with "confirm": true or narrow it'
    )

    assert fixes.confirm_hint(message) == (
        "the selector matches 150 tasks in 3 jobs (more than 100); repeat with --yes"
        " (see --dry-run) or narrow it"
    )


RESULT = {
    "id": 7,
    "action": "recover",
    "dry_run": True,
    "matched": 5,
    "jobs": 2,
    "applied": 2,
    "refused": 3,
    "refusals": {"not allowed in state completed": 1, "not allowed in state on_cpu": 2},
    "sample": [
        {"id": "t-1", "job_id": "j-1", "index": 0, "state": "failed_on_cluster",
         "failure_class": "lost", "host": "h-\x1b[31m"},
    ],
}  # fmt: skip


def test_when_a_result_is_shown__the_summary_refusals_and_sample_say_what_was_matched() -> None:
    console = Console(width=120, record=True)
    console.print(fixes.sample_table(RESULT))
    table = console.export_text()

    assert fixes.summary(RESULT) == (
        "fix 7 recover (dry run): 5 task(s) in 2 job(s) matched, 2 would change, 3 refused"
    )
    assert fixes.refusal_lines(RESULT) == [
        "  2 refused: not allowed in state on_cpu",
        "  1 refused: not allowed in state completed",
    ]
    assert "h-\\x1b[31m" in table and "\x1b" not in table
    assert "the first 1 of 5" in table


def test_when_records_are_listed__each_line_shows_who_what_and_the_selector() -> None:
    record = RESULT | {
        "actor": "ops\x1b[2J",
        "at": "2024-05-01T12:00:00+00:00",
        "selector": {"hosts": ["h-1"], "job_name": "a*"},
    }

    assert fixes.record_line(record) == (
        "7  2024-05-01 12:00:00  ops\\x1b[2J  recover (dry run): matched 5, changed 2, refused 3"
        '  {"hosts": ["h-1"], "job_name": "a*"}'
    )
