-- Supervision and fault tolerance: failure triage, backoff, fencing records,
-- signs of life, job errors, host heartbeats of the supervisor, quarantine, probing.

ALTER TABLE tasks
    ADD COLUMN decided boolean NOT NULL DEFAULT true,   -- false while a failure awaits triage
    ADD COLUMN not_before timestamptz;                  -- backoff: not released before this

-- Failed tasks that the scheduler has not yet decided about (recover, resubmit, give up).
CREATE INDEX tasks_undecided ON tasks (updated_at) WHERE NOT decided;

ALTER TABLE attempts
    ADD COLUMN status jsonb,            -- the status file the attempt left, if any
    ADD COLUMN decision text,           -- what triage decided after this attempt failed
    ADD COLUMN decision_reason text,
    ADD COLUMN decided_at timestamptz,
    ADD COLUMN late_report jsonb,       -- a report from this attempt after it was fenced off
    ADD COLUMN reaped_at timestamptz,   -- its process is known gone (killed or found dead)
    ADD COLUMN detected_after_s double precision;  -- from the failure to its failed state
CREATE INDEX attempts_host_failures ON attempts (host, ended_at)
    WHERE failure_class IN ('signal', 'lost', 'hung');

ALTER TABLE jobs
    ADD COLUMN probing_since timestamptz;   -- failure rate passed the threshold: one at a time

ALTER TABLE hosts
    ADD COLUMN supervisor text,
    ADD COLUMN supervisor_heartbeat_at timestamptz,
    ADD COLUMN quarantined_until timestamptz,
    ADD COLUMN quarantine_reason text;

-- Every error-severity log record that failed a task, kept with its job.
CREATE TABLE job_errors (
    id        bigserial PRIMARY KEY,
    job_id    text NOT NULL REFERENCES jobs (id),
    task_id   text NOT NULL REFERENCES tasks (id),
    ts        timestamptz NOT NULL DEFAULT now(),
    severity  text NOT NULL,
    brief     text NOT NULL,
    detail    text
);
CREATE INDEX job_errors_job ON job_errors (job_id, id);
CREATE INDEX jobs_probing ON jobs (id) WHERE probing_since IS NOT NULL;

-- The scheduler prunes the logs of jobs ended longer ago than the retention.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
