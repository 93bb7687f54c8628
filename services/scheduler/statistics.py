"""The planner's statistics of Vigil's busiest tables, kept up to date as they grow.

A statement's plan is made once per connection (asyncpg's prepared statements, the plpgsql
functions) and made again only when the statistics of a table it reads change. A plan made
while a table was young (a fresh database) reads the whole table where an index probe was
meant, and keeps doing so as the table grows: the submission's release scanned every task and
every active job, 1.3 ms a job after 1,000 jobs and growing with the history.
Autovacuum, where it runs, analyses a table once `50 + 10 %`
of its rows changed since its last analysis, but only at its next look (`autovacuum_naptime`,
a minute by default): a plan made meanwhile sees a big job's thousands of new tasks as none,
and the waiters' statement drove from them, 4.6 ms a task's end. So the
leading scheduler analyses the tables below itself, whether autovacuum runs or not, each once
it holds twice the rows it held at its last analysis (and at least `FIRST_ROWS`: a plan's
choices hardly matter on fewer): about a dozen times on a table's way to a million rows, and
never again while its size holds. Updates alone do not count (a task's row is updated several
times, the outbox's rows come and go): they seldom change what a plan should be, and each
analysis makes every connection plan again; autovacuum, where it runs, takes care of them.

But for one: the tasks in flight. The statements over them (index `tasks_in_flight`) are
planned from the share of the tasks with a claim. With statistics taken while no task was
claimed, the planner expects one row there: the hosts' read then joined each task to its job
by an index probe, 45 ms at a thousand hosts of 16 CPUs instead of 8 with a hash join
(that read, `pool_repo.HELD_BY_HOST_AND_OWNER`, now reads what each task holds from the
task itself, migration 0043, and looks up by id the job of a task claimed before it). A
table of ten million ended tasks does not double for a long while, and autovacuum waits for
a tenth of it to change. So `tasks` is also analysed once the tasks claimed now (`claimed`,
what the dispatcher's last look saw on hosts) are more than twice those its last analysis
counted (the share of its rows with a claim, at least `FIRST_ROWS`): a few times as a pool
fills up, and never while it stays full.

And `task_prerequisites` from its first look, empty: a table never analysed is planned as
ten pages of rows, and the waiters' statement, which reads the waiting tasks' prerequisites,
drove from the waiting tasks and probed the (empty) table once for each: 1.25 ms a look with
1,000 tasks waiting, O(tasks waiting), up to ten looks a second while tasks end; 0.03 ms
once the table was analysed.
Autovacuum analyses it only once 50 of its rows changed: an installation whose jobs have no
prerequisites never would.

And `hosts`, from its tenth row (`FIRST_HOSTS`): every round reads all of it, and a plan
made while the pool's hosts were being registered (the planner expects one) joins each of
them to the aggregate of the tasks in flight again: the feed's read of what the hosts hold
took 1.5-5 ms a round at 100 hosts, where a hash join takes 0.3.
A few analyses on a pool's way to a thousand hosts.
"""

import logging
from typing import Final

from shared.store.db import Connection

logger = logging.getLogger(__name__)

#: How often the scheduler looks while busy (one statement; an ANALYZE only when one is due);
#: an idle round does not look (tables do not grow while nothing happens).
EVERY_S: Final = 1.0
#: A table is analysed first once it holds this many rows.
FIRST_ROWS: Final = 500
#: But `hosts` from this many: every round reads all of its rows.
FIRST_HOSTS: Final = 10
#: The tables of the task path and the hosts, each with the rows of its first analysis
#: (constants: never user text in the ANALYZE below). Not the outbox: it holds only what
#: waits, vacuumed by the relay (which sets its size), and is read through its primary key
#: whatever its statistics say (migration 0032); analysed at each big submission, it made
#: every connection plan its outbox statements again for nothing.
TABLES: Final = {
    "jobs": FIRST_ROWS,
    "tasks": FIRST_ROWS,
    "attempts": FIRST_ROWS,
    "events": FIRST_ROWS,
    "hosts": FIRST_HOSTS,
    "task_prerequisites": 0,
}

#: The tables due for an analysis: twice the rows of their last one, at least their first
#: rows ($2, as $1 orders them); and `tasks` once the tasks claimed now ($3) are twice those
#: claimed at its last one (at least `FIRST_ROWS`, $4).
_DUE: Final = """
SELECT s.relname::text AS name
FROM unnest($1::text[], $2::int[]) AS d(name, first_rows)
JOIN pg_stat_user_tables s ON s.relname = d.name AND s.schemaname = current_schema()
JOIN pg_class c ON c.oid = s.relid
WHERE (s.n_live_tup > 2 * c.reltuples AND s.n_live_tup >= d.first_rows)
   OR (s.relname = 'tasks' AND $3::bigint > greatest($4, 2 * c.reltuples * (
           SELECT 1 - p.null_frac FROM pg_stats p
           WHERE p.schemaname = s.schemaname AND p.tablename = 'tasks'
             AND p.attname = 'claim')))
"""


async def analyse_due(conn: Connection, claimed: int = 0) -> list[str]:
    """ANALYZE the tables of `TABLES` that are due (`claimed`: the tasks claimed now, as the
    dispatcher's last look saw them); their names."""
    found = {
        row["name"]
        for row in await conn.fetch(_DUE, list(TABLES), list(TABLES.values()), claimed, FIRST_ROWS)
    }
    due = [name for name in TABLES if name in found]
    for name in due:  # one of our constants: the only text put in the statement
        await conn.execute(f"ANALYZE {name}")
    if due:
        logger.info("analysed %s (grown twofold, or its tasks claimed)", ", ".join(due))
    return due
