-- Vigil schema, version 1. PostgreSQL is the truth; Redis and the broker hold nothing that matters.

CREATE TYPE task_state AS ENUM (
    'new', 'on_hold', 'setting_up', 'queued', 'on_cpu', 'data_ready', 'post_processing',
    'completed', 'failed_to_setup', 'failed_on_cluster', 'failed_to_post_process',
    'failed_setup_prerequisites', 'failed_post_processing_prerequisites', 'terminated',
    'recover_setup', 'recovering_setup', 'recover_cluster', 'recovering_cluster',
    'recover_post_processing', 'recovering_post_processing',
    'restart_setup', 'restarting_setup', 'restart_cluster', 'restarting_cluster',
    'restart_post_processing', 'restarting_post_processing'
);

CREATE TYPE job_state AS ENUM ('active', 'suspended', 'completed', 'failed', 'cancelled');

CREATE TYPE failure_class AS ENUM (
    'exit', 'signal', 'lost', 'hung', 'walltime', 'error_log', 'hook', 'cancelled'
);

CREATE TABLE users (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    role        text NOT NULL CHECK (role IN ('user', 'operator')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tokens (
    token_hash  text PRIMARY KEY,          -- sha256 hex of the bearer token; the token is never stored
    user_id     text NOT NULL REFERENCES users (id),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    id               text PRIMARY KEY,
    owner_id         text NOT NULL REFERENCES users (id),
    name             text NOT NULL,
    type             text NOT NULL,
    command          text NOT NULL,
    outputs          jsonb NOT NULL DEFAULT '[]',
    params           jsonb NOT NULL DEFAULT '{}',
    policy           jsonb NOT NULL DEFAULT '{}',
    prerequisites    jsonb NOT NULL DEFAULT '{}',
    inputs_from      text REFERENCES jobs (id),
    state            job_state NOT NULL DEFAULT 'active',
    idempotency_key  text,
    max_in_flight    integer NOT NULL DEFAULT 1000 CHECK (max_in_flight > 0),
    release_per_tick integer NOT NULL DEFAULT 1000 CHECK (release_per_tick > 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    UNIQUE (owner_id, idempotency_key)
);
CREATE INDEX jobs_active ON jobs (created_at) WHERE state = 'active';
CREATE INDEX jobs_owner ON jobs (owner_id, created_at DESC);

CREATE TABLE tasks (
    id                text PRIMARY KEY,
    job_id            text NOT NULL REFERENCES jobs (id),
    index             integer NOT NULL,
    input             jsonb NOT NULL,
    state             task_state NOT NULL DEFAULT 'new',
    run_number        integer NOT NULL DEFAULT 1,
    attempt           integer NOT NULL DEFAULT 0,      -- attempts started, all stages together
    claim             uuid,                            -- fencing token of whoever drives the task now
    worker            text,                            -- worker instance that holds the claim
    host              text,                            -- host of the work dir (and of the process)
    pid               integer,
    pid_create_time   double precision,
    workdir           text,
    failure_class     failure_class,
    exit_code         integer,
    signal            integer,
    error_brief       text,
    error_detail      text,
    progress          integer CHECK (progress BETWEEN 0 AND 100),
    resubmitted_from  text REFERENCES tasks (id),
    superseded_by     text REFERENCES tasks (id),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, index)
);
CREATE INDEX tasks_dispatchable ON tasks (job_id) WHERE claim IS NULL AND state IN ('new', 'queued', 'data_ready');
CREATE INDEX tasks_held ON tasks (worker) WHERE worker IS NOT NULL;
CREATE INDEX tasks_host_state ON tasks (host, state);

-- Prerequisites of design §4: `task_id` waits at `stage` for `on_task_id` to reach `required`.
CREATE TABLE task_prerequisites (
    task_id     text NOT NULL REFERENCES tasks (id),
    stage       text NOT NULL CHECK (stage IN ('setup', 'post_processing')),
    on_task_id  text NOT NULL REFERENCES tasks (id),
    required    text NOT NULL CHECK (required IN ('queued', 'data_ready', 'completed', 'failed')),
    PRIMARY KEY (task_id, stage, on_task_id)
);
CREATE INDEX task_prerequisites_on ON task_prerequisites (on_task_id);

-- One row per execution of one stage of a task: append-only, the "why did this run three times" table.
CREATE TABLE attempts (
    id             bigserial PRIMARY KEY,
    task_id        text NOT NULL REFERENCES tasks (id),
    attempt        integer NOT NULL,
    run_number     integer NOT NULL,
    stage          text NOT NULL,
    host           text,
    worker         text,
    claim          uuid,
    pid            integer,
    started_at     timestamptz NOT NULL DEFAULT now(),
    ended_at       timestamptz,
    outcome        text,                 -- the state the attempt led to
    exit_code      integer,
    signal         integer,
    failure_class  failure_class,
    error_brief    text,
    error_detail   text,
    log_path       text,
    UNIQUE (task_id, attempt)
);

-- Transactional outbox: written with the change it describes, relayed to the broker by the scheduler.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    exchange      text NOT NULL CHECK (exchange IN ('events', 'work')),
    routing_key   text NOT NULL,
    body          jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX outbox_pending ON outbox (id) WHERE published_at IS NULL;

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vigil_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Every output line of every command, in the order the worker read them.
CREATE TABLE logs (
    seq         bigserial PRIMARY KEY,
    job_id      text NOT NULL,
    task_id     text NOT NULL,
    run_number  integer NOT NULL,
    attempt     integer NOT NULL,
    line_no     integer NOT NULL,
    ts          timestamptz NOT NULL,
    severity    text NOT NULL,
    stream      text NOT NULL,
    line        text NOT NULL,
    UNIQUE (task_id, attempt, line_no)
);
CREATE INDEX logs_job ON logs (job_id, seq);

CREATE TABLE hosts (
    id            text PRIMARY KEY,
    slots         integer NOT NULL,
    worker        text,                  -- current worker instance
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    quarantined   boolean NOT NULL DEFAULT false
);
