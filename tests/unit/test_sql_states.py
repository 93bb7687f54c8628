"""The state lists of the hot-path partial indexes are the ones the queries spell out."""

import re
from pathlib import Path

from shared.domain.states import TaskState
from shared.store import sql_states

_MIGRATION = Path(sql_states.__file__).parent / "sql" / "0011_hot_path_indexes.sql"


def _lists_of(index: str) -> set[frozenset[str]]:
    text = _MIGRATION.read_text()
    body = text[text.index(f"CREATE INDEX {index}") :].split(";")[0]
    return {
        frozenset(re.findall(r"'([a-z_]+)'", group))
        for group in re.findall(r"NOT IN \(([^)]*)\)", body)
    }


def _states(literal: str) -> frozenset[str]:
    return frozenset(re.findall(r"'([a-z_]+)'", literal))


def test_the_in_flight_index_lists_exactly_the_states_not_in_flight() -> None:
    assert _lists_of("tasks_in_flight") == {_states(sql_states.NOT_IN_FLIGHT)}


def test_the_unfinished_index_lists_exactly_the_terminal_states() -> None:
    assert _lists_of("tasks_unfinished") == {_states(sql_states.TERMINAL_LIST)}


def test_every_listed_word_is_a_task_state() -> None:
    words = _states(sql_states.NOT_IN_FLIGHT) | _states(sql_states.TERMINAL_LIST)
    assert words <= {s.value for s in TaskState}


def test_the_function_that_ends_jobs_lists_exactly_the_terminal_states() -> None:
    text = (_MIGRATION.parent / "0029_end_finished_jobs.sql").read_text()
    [listed] = re.findall(r"NOT IN \(([^)]*)\)", text)
    assert _states(listed) == _states(sql_states.TERMINAL_LIST)
