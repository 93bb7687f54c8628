"""State sets as SQL literals, for conditions that partial indexes must be seen to serve.

PostgreSQL uses a partial index only when the query's condition implies the index's, which it
cannot know of a parameter (`state = ANY($1)`). Queries that must use one of the indexes of
`sql/0011_hot_path_indexes.sql` spell the states out with these (made from `shared.domain.states`,
so a new state cannot be forgotten here; `tests/unit/test_sql_states.py` checks the migration).
"""

from typing import Final

from shared.domain.states import IN_FLIGHT, TERMINAL, TaskState


def literal(states: frozenset[TaskState]) -> str:
    """`('a', 'b', ...)`: the states, sorted, as an SQL list (enum values are fixed words)."""
    return "(" + ", ".join(f"'{s.value}'" for s in sorted(states)) + ")"


#: Not in flight: `state NOT IN NOT_IN_FLIGHT` (with `claim IS NOT NULL`) is `tasks_in_flight`.
NOT_IN_FLIGHT: Final = literal(frozenset(TaskState) - IN_FLIGHT)
#: `state NOT IN TERMINAL_LIST` (with `NOT decided`) is `tasks_unfinished`.
TERMINAL_LIST: Final = literal(TERMINAL)
