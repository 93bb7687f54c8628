-- A command the kernel killed for going over its task's own memory limit:
-- the job's failure (design §5, blame), never the host's; an app failure (not retried unless
-- the job lists the exit code or signal), since the same input would go over again.
ALTER TYPE failure_class ADD VALUE IF NOT EXISTS 'limit';
