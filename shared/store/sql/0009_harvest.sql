-- Harvest and cleanup: small outputs kept for download, a retention per job, and
-- the record of a job's purge (its logs, kept outputs and work dirs removed).

-- The bytes of a small output file, read by the worker when it recorded the file (null: too
-- large, see `not_kept`, or purged with its job).
ALTER TABLE task_outputs
    ADD COLUMN content bytea,
    ADD COLUMN not_kept text;           -- why the bytes were not kept (said by the worker)

ALTER TABLE jobs
    ADD COLUMN retention_s double precision CHECK (retention_s > 0),  -- null: keep forever
    ADD COLUMN purged_at timestamptz,
    ADD COLUMN purged_by text,
    ADD COLUMN purge_reason text,
    ADD CONSTRAINT jobs_purge_recorded CHECK ((purged_at IS NULL) = (purged_by IS NULL));

-- The scheduler's retention round: finished jobs with a retention that are not purged yet.
CREATE INDEX jobs_retention_due ON jobs (finished_at)
    WHERE retention_s IS NOT NULL AND purged_at IS NULL AND finished_at IS NOT NULL;
