-- When a retired host's work and supervise queues were deleted (services/scheduler/
-- host_queues.py). A host whose heartbeats are newer came back: its queues exist again.
ALTER TABLE hosts ADD COLUMN queues_deleted_at timestamptz;
