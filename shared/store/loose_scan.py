"""The jobs that have a task matching a condition, read by a loose index scan.

PostgreSQL has no skip scan: a `DISTINCT job_id` over an index reads every entry, and a probe
per job reads every job. A recursive CTE descends the index once per distinct job instead,
each time to the first entry past the last job found. Where few jobs have such a task among
many jobs (thousands of one-task jobs running, none waiting), that is a few descents where a
probe per job was thousands; where every job has one, a descent costs about twice a probe.
"""

from typing import Final

#: An unclaimed new task `t`: the predicate of `tasks_new` (migration 0011).
NEW: Final = "t.claim IS NULL AND t.state = 'new'"


def jobs_with(name: str, tasks: str) -> str:
    """A `WITH RECURSIVE` item `name(job_id)`: the jobs that have a task `t` matching `tasks`,
    in job order, then one NULL row (the end; filter it out or stop before it). `tasks` must
    be the predicate of a partial index on `(job_id, ...)` for each step to be one descent
    (`tasks_new`, `tasks_resting`). Constants only: never user text."""
    return f"""{name}(job_id) AS (
    (SELECT t.job_id FROM tasks t WHERE {tasks} ORDER BY t.job_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.job_id FROM tasks t WHERE {tasks} AND t.job_id > p.job_id
            ORDER BY t.job_id LIMIT 1)
    FROM {name} p WHERE p.job_id IS NOT NULL)"""
