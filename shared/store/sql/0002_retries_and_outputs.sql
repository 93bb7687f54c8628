-- Retry budgets and the resume state handed back to the next attempt, and task outputs.

ALTER TABLE tasks
    ADD COLUMN app_retries integer NOT NULL DEFAULT 0,     -- automatic recoveries in place used
    ADD COLUMN infra_retries integer NOT NULL DEFAULT 0,   -- automatic resubmissions used (lineage)
    ADD COLUMN resume jsonb;                               -- `resume` of the last status file, for $VIGIL_RESUME

-- The results of a task: one row per declared output, found-or-created (idempotent) per run.
CREATE TABLE task_outputs (
    task_id     text NOT NULL REFERENCES tasks (id),
    run_number  integer NOT NULL,
    name        text NOT NULL,
    path        text NOT NULL,
    host        text,
    size        bigint NOT NULL,
    sha256      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, run_number, name)
);
