-- NOTIFY serializes every committing transaction that sent one (PostgreSQL holds a lock on
-- "database 0" from pre-commit until after the WAL flush): under load, most of the worker's
-- commits were waiting on it. The events a worker writes along
-- a task's normal path (setting_up, queued, on_cpu, data_ready, post_processing) wake nobody:
-- no scheduling round acts on them, and the relay publishes them with the next notified batch
-- or its next short poll. Work messages and every other event still notify.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange <> 'events' OR split_part(routing_key, '.', 1) <> 'task'
           OR split_part(routing_key, '.', 2) NOT IN
              ('setting_up', 'queued', 'on_cpu', 'data_ready', 'post_processing')
    ) THEN
        PERFORM pg_notify('vigil_outbox', '');
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- The finaliser's look for jobs cancelled since its last round (their Redis keys are purged).
CREATE INDEX jobs_cancelled ON jobs (finished_at, id) WHERE state = 'cancelled';
