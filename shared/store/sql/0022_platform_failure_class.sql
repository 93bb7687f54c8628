-- A failure of Vigil's own servers under a task's bookkeeping: the database
-- went away (a restart) longer than the worker could wait, or where it could not tell what had
-- committed. Infra (a restartable job is resubmitted), blamed on neither the job nor the host:
-- it counts towards no quarantine.
ALTER TYPE failure_class ADD VALUE IF NOT EXISTS 'platform';
