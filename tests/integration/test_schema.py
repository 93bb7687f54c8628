"""The SQL enums mirror the Python enums, so a state added on one side cannot be forgotten."""

import re
from enum import StrEnum

import pytest

from shared.domain.states import FailureClass, JobState, TaskState
from shared.store import db
from shared.store.release_round import RESTING_STATES

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("sql_type", "enum"),
    [("task_state", TaskState), ("job_state", JobState), ("failure_class", FailureClass)],
)
async def test_when_reading_a_sql_enum__its_values_equal_the_python_enum(
    pool: db.Pool, sql_type: str, enum: type[StrEnum]
) -> None:
    rows = await pool.fetch(
        "SELECT e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid"
        " WHERE t.typname = $1",
        sql_type,
    )
    assert {r["enumlabel"] for r in rows} == {member.value for member in enum}


async def test_the_resting_index_lists_exactly_the_states_the_dispatcher_queries(
    pool: db.Pool,
) -> None:
    definition = await pool.fetchval(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index"
        " WHERE indexrelid = 'tasks_resting'::regclass"
    )

    named = set(re.findall(r"'([a-z_]+)'::task_state", definition))
    assert named == {s.value for s in RESTING_STATES}
