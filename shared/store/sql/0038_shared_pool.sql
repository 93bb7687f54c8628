-- A shared pool: what the scheduling planner (`shared/domain/scheduling/`) reads and
-- what it leaves, so that work is released by free capacity, placed where its request fits,
-- shared between users by their shares and ordered by priority, with a reason for every wait.

-- A job's priority among its owner's jobs (higher first; age keeps the rest from starving),
-- and the request of each of its tasks: CPUs in millicores (integers: a sum of requests can
-- never round past a host's capacity), memory in MiB (0: none asked), GPUs (whole devices).
ALTER TABLE jobs
    ADD COLUMN priority integer NOT NULL DEFAULT 0,
    ADD COLUMN req_millicpus integer NOT NULL DEFAULT 1000 CHECK (req_millicpus > 0),
    ADD COLUMN req_memory_mb integer NOT NULL DEFAULT 0 CHECK (req_memory_mb >= 0),
    ADD COLUMN req_gpus integer NOT NULL DEFAULT 0 CHECK (req_gpus >= 0);

-- A user's fair share (default 1) and decayed usage in CPU-seconds as of `usage_at`
-- (`shared/domain/scheduling/fairshare.py`: charged by the leading scheduler).
ALTER TABLE users
    ADD COLUMN share real NOT NULL DEFAULT 1 CHECK (share > 0),
    ADD COLUMN usage double precision NOT NULL DEFAULT 0,
    ADD COLUMN usage_at timestamptz NOT NULL DEFAULT now();

-- A host's capacity, as its worker advertises it at registration (detected, or
-- VIGIL_HOST_CPUS / VIGIL_HOST_MEMORY_MB / VIGIL_HOST_GPUS); 0 until a worker registered.
ALTER TABLE hosts
    ADD COLUMN capacity_millicpus integer NOT NULL DEFAULT 0,
    ADD COLUMN capacity_memory_mb integer NOT NULL DEFAULT 0,
    ADD COLUMN gpu_ids text[] NOT NULL DEFAULT '{}';

-- The GPU devices a task was placed with (its own: never another running task's), set with
-- its host when the scheduler claims it for that host.
ALTER TABLE tasks ADD COLUMN gpu_ids text[];

-- Why a job's waiting tasks wait, as the last planning round that saw them had it: one row
-- per job, written when it changes (a task's own reason, prerequisites or a backoff, is read
-- from the task; writing every waiting task each round is what the planner avoids).
CREATE TABLE job_waits (
    job_id text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    reason text NOT NULL,
    message text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    at timestamptz NOT NULL DEFAULT now()
);
