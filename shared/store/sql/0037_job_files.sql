-- A job's own files: scripts, configs and small data a user submits with the job,
-- placed read-only in every task's work dir on any host. The job keeps their list (path,
-- size, sha256, executable) in `jobs.files`; the bytes are stored once per job, here, and
-- read by a host's worker the first time one of the job's tasks is set up there. A purge
-- deletes them (the list stays, as the record of what the job ran with).
ALTER TABLE jobs ADD COLUMN files jsonb NOT NULL DEFAULT '[]'::jsonb;

CREATE TABLE job_files (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    path text NOT NULL,
    content bytea NOT NULL,
    PRIMARY KEY (job_id, path)
);
