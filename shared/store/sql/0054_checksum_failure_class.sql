-- An object a task names whose bytes, fetched twice, do not have the sha256 named for them: the
-- store holds other bytes under that name (a file uploaded other than named, an object changed
-- or corrupted in the store). Not retried (a retry would fetch the same bytes), never the host's.
ALTER TYPE failure_class ADD VALUE IF NOT EXISTS 'checksum';
