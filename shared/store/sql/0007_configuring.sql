-- Try before production: a job can be created `configuring`, where only test tasks
-- run and its command, inputs and policy can still be edited; `activate` makes its tasks.

ALTER TYPE job_state ADD VALUE IF NOT EXISTS 'configuring' BEFORE 'active';

ALTER TABLE jobs
    ADD COLUMN inputs jsonb,            -- the inputs held while configuring (null once active)
    ADD COLUMN activated_at timestamptz;

-- A test task (negative index) runs while its job is configuring; its outputs are discarded
-- at activation and it never counts towards the job's outcome.
ALTER TABLE tasks
    ADD COLUMN test boolean NOT NULL DEFAULT false;

-- What was changed in a job after its submission, by whom (`PATCH /jobs/{id}`).
CREATE TABLE job_edits (
    id       bigserial PRIMARY KEY,
    job_id   text NOT NULL REFERENCES jobs (id),
    actor    text NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    state    job_state NOT NULL,        -- the job's state when it was edited
    changes  jsonb NOT NULL             -- field -> new value
);
CREATE INDEX job_edits_job ON job_edits (job_id, id);
