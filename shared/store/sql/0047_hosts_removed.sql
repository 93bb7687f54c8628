-- A host an operator removed (shared/operations/host_removal.py): when, and by whom. A
-- removed host is not listed, takes no work, and its queues are deleted once nothing in them
-- is owed; a worker that registers under its id again clears both (a new life).
ALTER TABLE hosts ADD COLUMN removed_at timestamptz, ADD COLUMN removed_by text;
