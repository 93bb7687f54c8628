-- A failure the host caused and the command did not: its work root full,
-- over quota or read-only. Infra (a restartable job is resubmitted) and counted against the
-- host, so a host with a full disk goes to quarantine instead of failing every task.
ALTER TYPE failure_class ADD VALUE IF NOT EXISTS 'host';
