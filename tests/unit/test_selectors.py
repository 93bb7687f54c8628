"""Task selectors (global fixes): validation, the glob to LIKE translation and the SQL built."""

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from shared.domain.selectors import EMPTY, TaskSelector, like_pattern, where

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _errors(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        TaskSelector.model_validate(fields)
    return str(caught.value)


@pytest.mark.parametrize(
    "fields",
    [{}, {"states": []}, {"include_superseded": True}, {"hosts": [], "job_ids": []}],
)
def test_when_no_criterion_is_given__the_selector_is_refused_as_empty(
    fields: dict[str, Any],
) -> None:
    message = _errors(**fields)

    assert EMPTY in message
    assert "states, failure_classes, hosts, job_ids, job_name" in message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"states": ["lost"]}, "states.0"),
        ({"failure_classes": ["failed_on_cluster"]}, "failure_classes.0"),
        ({"hosts": ["Host 1"]}, "host id 'Host 1' is not a valid id"),
        ({"job_ids": ["j-1/../x"]}, "job id 'j-1/../x' is not a valid id"),
        ({"job_name": ""}, "job_name"),
        ({"job_name": "x" * 201}, "job_name"),
        ({"job_name": "a\x1b[2Jb"}, "printable text"),
        ({"job_name": "a\x00b"}, "printable text"),
        ({"job_name": "a\ud800b"}, "job_name"),
        ({"updated_after": "2024-05-01T12:00:00"}, "timezone"),
        ({"updated_after": "0001-01-01T00:00:00+05:00"}, "out of range"),
        (
            {"updated_after": "2024-05-02T00:00:00Z", "updated_before": "2024-05-01T00:00:00Z"},
            "updated_after must be earlier than updated_before",
        ),
        ({"states": ["new"], "owner": "me"}, "owner"),
    ],
)
def test_when_a_criterion_is_malformed__the_error_names_it(
    fields: dict[str, Any], message: str
) -> None:
    assert message in _errors(**fields)


@pytest.mark.parametrize(
    ("glob", "like"),
    [
        ("nightly-*", "nightly-%"),
        ("run-??", "run-__"),
        ("50%_x\\", "50\\%\\_x\\\\"),
        ("*%*", "%\\%%"),
        ("plain", "plain"),
        ("ünï ✓", "ünï ✓"),
    ],
)
def test_when_a_glob_is_translated__only_star_and_question_mark_are_wildcards(
    glob: str, like: str
) -> None:
    assert like_pattern(glob) == like


def test_when_every_criterion_is_given__each_is_a_bind_parameter_in_order() -> None:
    selector = TaskSelector(
        states=["failed_on_cluster", "failed_to_setup", "failed_on_cluster"],
        failure_classes=["lost"],
        hosts=["h-2", "h-1"],
        job_ids=["j-1"],
        job_name="50%_x\\*",
        updated_after=T0,
        updated_before=T0 + timedelta(hours=1),
    )

    clause = where(selector, owner_id="u-1")

    assert clause.sql == (
        "t.state = ANY($1::task_state[]) AND t.failure_class = ANY($2::failure_class[])"
        " AND t.host = ANY($3::text[]) AND t.job_id = ANY($4::text[])"
        " AND j.name LIKE $5 ESCAPE '\\' AND t.updated_at >= $6 AND t.updated_at < $7"
        " AND j.owner_id = $8 AND t.superseded_by IS NULL AND NOT t.test"
    )
    assert clause.args == [
        ["failed_on_cluster", "failed_to_setup"],
        ["lost"],
        ["h-1", "h-2"],
        ["j-1"],
        "50\\%\\_x\\\\%",
        T0,
        T0 + timedelta(hours=1),
        "u-1",
    ]


def test_when_an_operator_selects__no_owner_limit_is_added() -> None:
    clause = where(TaskSelector(job_name="*"), owner_id=None)

    assert clause.sql == "j.name LIKE $1 ESCAPE '\\' AND t.superseded_by IS NULL AND NOT t.test"
    assert clause.args == ["%"]


def test_when_superseded_tasks_are_included__that_condition_is_dropped() -> None:
    clause = where(TaskSelector(states=["failed_on_cluster"], include_superseded=True), None)

    assert "superseded_by" not in clause.sql


def test_when_hostile_text_is_in_the_selector__it_never_reaches_the_sql() -> None:
    name = "x'; DROP TABLE tasks; --"
    clause = where(TaskSelector(job_name=name), owner_id="u'1")

    assert "DROP" not in clause.sql and "u'1" not in clause.sql
    assert clause.args == [name, "u'1"]


def test_when_times_have_offsets__they_stay_aware() -> None:
    plus_two = timezone(timedelta(hours=2))
    selector = TaskSelector(updated_after=datetime(2024, 5, 1, 14, 0, tzinfo=plus_two))

    assert where(selector, None).args == [T0]
