-- A task's lines of one run, newest first (the dashboard's task page opens on its tail; the api's
-- `GET /jobs/{id}/logs?task=&run=` reads the same lines forward): without it, a task of a big,
-- chatty job was found by walking the whole job's lines.
CREATE INDEX logs_task ON logs (task_id, run_number, seq);
