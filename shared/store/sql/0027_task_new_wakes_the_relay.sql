-- A task's `task.new` event wakes the relay only: the round is woken for new tasks
-- by whoever adds them (`jobs_repo.add_tasks` notifies 'round' in its own statement), unless
-- the adder releases them itself (a submission: `release_round.release_job`) and wakes the
-- round only for what it left. The rest as in 0014.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'events'
          AND NOT (split_part(routing_key, '.', 1) = 'task' AND split_part(routing_key, '.', 2)
                   IN ('new', 'setting_up', 'queued', 'on_cpu', 'data_ready', 'post_processing'))
          AND NOT (split_part(routing_key, '.', 1) = 'job'
                   AND split_part(routing_key, '.', 2) IN ('succeeded', 'failed'))
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'round');
    ELSIF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'work' OR split_part(routing_key, '.', 1) = 'job'
           OR routing_key LIKE 'task.new.%'
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'relay');
    END IF;
    RETURN NULL;
END $$;
