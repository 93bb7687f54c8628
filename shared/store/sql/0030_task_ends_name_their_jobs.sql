-- A task's terminal event names its job in the notification: 'ended <job id>,...'
-- wakes the relay and, at once, the round's finaliser for those jobs, which until now waited
-- for the relay to publish the event (0028: a confirm and a second wake-up later). The relay
-- no longer tells the finaliser of a task's end; a notification lost with the listener's
-- connection leaves the job to the finaliser's sweep (every 2 s). The job ids (`j-` and
-- letters and digits: never a comma) go at most 200 to a notification (a payload holds 8000
-- bytes). Otherwise as in 0028: 'round' for an event the round acts on, else 'relay' for a
-- row only the relay has to act on.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended text;
    told boolean := false;
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
        told := true;
    END IF;
    FOR ended IN
        SELECT string_agg(e.job_id, ',' ORDER BY e.job_id) FROM (
            SELECT d.job_id, (row_number() OVER (ORDER BY d.job_id) - 1) / 200 AS chunk
            FROM (SELECT DISTINCT split_part(routing_key, '.', 3) AS job_id FROM inserted
                  WHERE exchange = 'events' AND split_part(routing_key, '.', 1) = 'task'
                    AND split_part(routing_key, '.', 2) IN (
                        'completed', 'terminated', 'failed_to_setup', 'failed_on_cluster',
                        'failed_to_post_process', 'failed_setup_prerequisites',
                        'failed_post_processing_prerequisites')) d
        ) e GROUP BY e.chunk
    LOOP
        PERFORM pg_notify('vigil_outbox', 'ended ' || ended);
        told := true;
    END LOOP;
    IF NOT told AND EXISTS (
        SELECT 1 FROM inserted
        WHERE exchange = 'work' OR split_part(routing_key, '.', 1) = 'job'
           OR routing_key LIKE 'task.new.%'
    ) THEN
        PERFORM pg_notify('vigil_outbox', 'relay');
    END IF;
    RETURN NULL;
END $$;
