-- A purge marks the job (one short transaction), then clears its data in batches, each a short
-- statement of its own (no lock held long, whatever the job's size). `purge_done_at`
-- says the clearing finished; the scheduler finishes a clearing that was cut short.
ALTER TABLE jobs ADD COLUMN purge_done_at timestamptz;
UPDATE jobs SET purge_done_at = purged_at WHERE purged_at IS NOT NULL;
CREATE INDEX jobs_purge_unfinished ON jobs (purged_at)
    WHERE purged_at IS NOT NULL AND purge_done_at IS NULL;
