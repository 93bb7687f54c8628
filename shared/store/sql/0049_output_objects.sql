-- Where each output is kept in the object store (shared/objects; docs/explanation/storage.md):
-- its key, written once by the worker that ran the task before the task completed. Null for an
-- output recorded before outputs went to the store.
ALTER TABLE task_outputs ADD COLUMN object_key text;
