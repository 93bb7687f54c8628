"""The SQL enums mirror the Python enums, so a state added on one side cannot be forgotten."""

from enum import StrEnum

import pytest

from shared import db
from shared.states import FailureClass, JobState, TaskState

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
