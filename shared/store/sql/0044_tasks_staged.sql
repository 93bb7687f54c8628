-- Whether the planning round handed a task to its host beyond the host's free capacity (the
-- prefetch: `plan_repo._CLAIM`). A staged task waits on its host behind every task placed
-- on capacity (the worker's ledger), and the round may place another user's task ahead of
-- it when fair share ranks that user first (`shared/domain/scheduling/planner.py`). Any
-- other claim (a later stage's, `release_round`) clears it.
ALTER TABLE tasks ADD COLUMN staged boolean NOT NULL DEFAULT false;

-- The staged tasks not started yet, per host: what the round reads of them.
CREATE INDEX tasks_staged ON tasks (host)
    WHERE staged AND claim IS NOT NULL AND state IN ('new', 'setting_up', 'queued');
