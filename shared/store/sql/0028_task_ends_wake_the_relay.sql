-- A task's terminal event wakes the relay only. The round acts on a task's end once
-- the relay has published its event (the scheduler's `_on_published`: the finaliser is told
-- which job may have ended, the triage of a failure, the waiters, and the round is woken);
-- woken by the notification as well, it ran once more per task end before that, too early to
-- end the job. What a task's end makes releasable (the next task of a throttled job, one
-- that waited on it) is released by the round the relay wakes. The rest as in 0027.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'events'
          AND NOT (split_part(routing_key, '.', 1) = 'task' AND split_part(routing_key, '.', 2)
                   IN ('new', 'setting_up', 'queued', 'on_cpu', 'data_ready', 'post_processing',
                       'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
                       'failed_to_post_process', 'failed_setup_prerequisites',
                       'failed_post_processing_prerequisites'))
          AND NOT (split_part(routing_key, '.', 1) = 'job'
                   AND split_part(routing_key, '.', 2) IN ('succeeded', 'failed'))
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'round');
    ELSIF EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'work' OR split_part(routing_key, '.', 1) = 'job'
           OR (split_part(routing_key, '.', 1) = 'task' AND split_part(routing_key, '.', 2)
               IN ('new', 'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
                   'failed_to_post_process', 'failed_setup_prerequisites',
                   'failed_post_processing_prerequisites'))
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'relay');
    END IF;
    RETURN NULL;
END $$;
