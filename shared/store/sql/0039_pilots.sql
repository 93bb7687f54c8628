-- Pilots: hosts that a batch system starts as jobs, for a walltime.

-- When a host stops taking work for good: a pilot's allocation ends (its walltime). The
-- planner places on it only tasks whose walltime fits before then; NULL: never.
ALTER TABLE hosts ADD COLUMN ends_at timestamptz;

-- One row per pilot asked of the batch system, by an operator (`POST /pilots`) or by the
-- leading scheduler when work waits that no host can take. Only the leading scheduler talks
-- to the batch system: it submits `requested` pilots, follows their batch state, and cancels
-- those idle too long (`services/scheduler/pilots.py`).
CREATE TABLE pilots (
    id text PRIMARY KEY,
    pool text NOT NULL,
    backend text NOT NULL,
    state text NOT NULL DEFAULT 'requested'
        CHECK (state IN ('requested', 'pending', 'running', 'draining', 'ended')),
    batch_job_id text,
    host_id text,
    cpus integer NOT NULL CHECK (cpus > 0),
    memory_mb integer CHECK (memory_mb > 0),
    gpus integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    walltime_s integer NOT NULL CHECK (walltime_s > 0),
    -- the batch system's reason while pending (Slurm's squeue %r), or why it ended
    reason text,
    requested_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    ends_at timestamptz,
    ended_at timestamptz,
    -- since when its host has held no task (the scheduler cancels it after VIGIL_PILOTS_IDLE_S)
    idle_since timestamptz
);
CREATE INDEX pilots_live ON pilots (pool) WHERE state <> 'ended';
CREATE UNIQUE INDEX pilots_batch_job ON pilots (backend, batch_job_id) WHERE batch_job_id IS NOT NULL;
