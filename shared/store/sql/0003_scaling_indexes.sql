-- Keep the scheduler's per-round queries proportional to the work waiting, not to the history.

-- Tasks resting unclaimed with work to dispatch to their host (the dispatcher's second query);
-- its state list is `services/scheduler/dispatcher.py::RESTING_STATES` (a test keeps them equal).
CREATE INDEX tasks_resting ON tasks (job_id)
    WHERE claim IS NULL AND state IN (
        'queued', 'data_ready',
        'recover_setup', 'recover_cluster', 'recover_post_processing',
        'restart_setup', 'restart_cluster', 'restart_post_processing');

-- Pruning of published outbox rows.
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;
