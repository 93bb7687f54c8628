-- The scheduler's rounds read only what can change: each of these partial indexes lists the
-- rows one query looks for, so that its cost follows the work in hand, not the jobs' sizes or
-- the history. The state lists are spelled out: a partial index serves a query only when the
-- query's own condition, written the same way, implies it (shared/sql_states.py writes them).

-- Dispatcher: a job's unclaimed new tasks, in index order.
CREATE INDEX tasks_new ON tasks (job_id, index) WHERE claim IS NULL AND state = 'new';

-- Dispatcher: a job's tasks in flight (claimed, or between setup and the end), for
-- `max_in_flight`.
CREATE INDEX tasks_in_flight ON tasks (job_id)
    WHERE claim IS NOT NULL OR state NOT IN (
        'new', 'on_hold', 'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
        'failed_to_post_process', 'failed_setup_prerequisites',
        'failed_post_processing_prerequisites');

-- Finaliser: a job's tasks that keep it from ending (not terminal, or failed and undecided).
CREATE INDEX tasks_unfinished ON tasks (job_id)
    WHERE NOT test AND (NOT decided OR state NOT IN (
        'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
        'failed_to_post_process', 'failed_setup_prerequisites',
        'failed_post_processing_prerequisites'));
