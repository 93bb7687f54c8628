-- Who needs waking: the scheduling round only for rows it may act on; the relay for
-- every row it must publish soon. A notification says which: 'round' (the round and the relay)
-- or 'relay' (the relay only: work messages, which the round itself or the api wrote, and
-- the finaliser's `job.succeeded` / `job.failed`). The events of a task's normal path on its
-- worker still notify nobody (0012).
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'events'
          AND NOT (split_part(routing_key, '.', 1) = 'task' AND split_part(routing_key, '.', 2)
                   IN ('setting_up', 'queued', 'on_cpu', 'data_ready', 'post_processing'))
          AND NOT (split_part(routing_key, '.', 1) = 'job'
                   AND split_part(routing_key, '.', 2) IN ('succeeded', 'failed'))
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'round');
    ELSIF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'work' OR split_part(routing_key, '.', 1) = 'job'
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'relay');
    END IF;
    RETURN NULL;
END $$;
