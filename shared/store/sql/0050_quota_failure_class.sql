-- A task whose outputs would take its user's stored bytes over their quota: refused before or
-- while it is stored, the job's user's failure (never the host's, not retried: the same outputs
-- would go over again); the user frees bytes (a purge) or gets a larger quota, then recovers it.
ALTER TYPE failure_class ADD VALUE IF NOT EXISTS 'quota';
